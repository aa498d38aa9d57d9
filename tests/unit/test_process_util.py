"""Per-process GPU utilization: the simulated NVML's rules, the reader's attribution of processes
to leases, and a share's idle signal read from its own processes rather than its GPU's."""

from __future__ import annotations

import logging
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import parse_offer
from jupyterhub_gpupool.pool.quota import QuotaBook
from jupyterhub_gpupool.pool.reclaim import (
    GpuSample,
    KernelView,
    LeaseInfo,
    NoAction,
    PolicySet,
    PresenceView,
    ReclaimPolicy,
    Signals,
    plan_reclaims,
    share_samples,
    share_signal_source,
)
from jupyterhub_gpupool.telemetry.nvml import LEASE_ENV, NvmlReader, proc_environ
from jupyterhub_gpupool.telemetry.simnvml import SimNvml
from tests.fakes import SecondsClock

POOL = """
nodes:
  - name: l4
    gpus:
      - {model: L4}
      - {model: L4, load: {pattern: steady, level: 30, jitter: 0}}
  - name: amp
    gpus:
      - model: A100-80GB
        mig: {enabled: true, instances: [{profile: 3g.40gb, start: 0}]}
  - name: old
    gpus:
      - {model: G2}
"""
T0 = 3_000_000.0
BUSY = {"pattern": "steady", "level": 70, "jitter": 0}


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock(T0)


def machine(node: str, clock: SecondsClock) -> SimNvml:
    sim = SimNvml.from_yaml(POOL, node, clock=clock)
    sim.nvmlInit()
    return sim


def lease_env(lease: str) -> dict[str, str]:
    return {LEASE_ENV: lease, "HOME": "/home/x"}


# -- the simulated NVML ------------------------------------------------------------------------


def test_samples_are_per_active_process_and_newer_than_the_timestamp(clock):
    sim = machine("l4", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    busy = sim.add_process(0, load=BUSY)
    sim.add_process(0)  # holds memory, computes nothing: no sample (nvml.h: non-zero only)
    [s] = sim.nvmlDeviceGetProcessUtilization(gpu, 0)
    assert (s.pid, s.smUtil) == (busy, 70)
    assert s.timeStamp == int(T0 * 1_000_000)  # CPU time of the sample, microseconds
    with pytest.raises(sim.NVMLError_NotFound):  # nothing newer than what was seen
        sim.nvmlDeviceGetProcessUtilization(gpu, s.timeStamp)
    clock.advance(5)
    [later] = sim.nvmlDeviceGetProcessUtilization(gpu, s.timeStamp)
    assert later.timeStamp > s.timeStamp


def test_no_active_process_is_not_found(clock):
    sim = machine("l4", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError_NotFound):
        sim.nvmlDeviceGetProcessUtilization(gpu, 0)
    sim.add_process(0)
    with pytest.raises(sim.NVMLError_NotFound):
        sim.nvmlDeviceGetProcessUtilization(gpu, 0)


def test_process_load_adds_to_the_device_utilization(clock):
    sim = machine("l4", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(1)  # its own pattern: 30 %
    assert sim.nvmlDeviceGetUtilizationRates(gpu).gpu == 30
    pid = sim.add_process(1, load={"pattern": "steady", "level": 50, "jitter": 0})
    assert sim.nvmlDeviceGetUtilizationRates(gpu).gpu == 80
    sim.set_process_load(pid, "idle")
    assert sim.nvmlDeviceGetUtilizationRates(gpu).gpu == 30


def test_not_supported_on_mig(clock):
    """On MIG there is no utilization, per device or per process, on the GPU or its slices."""
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    sim.add_process(sim.nvmlDeviceGetUUID(mig), load=BUSY)
    for handle in (gpu, mig):
        with pytest.raises(sim.NVMLError_NotSupported):
            sim.nvmlDeviceGetProcessUtilization(handle, 0)


def test_not_supported_before_maxwell_or_without_the_symbol(clock):
    sim = machine("old", clock)  # a model of unknown architecture: not known to be Maxwell+
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetProcessUtilization(sim.nvmlDeviceGetHandleByIndex(0), 0)
    sim = machine("l4", clock)
    sim.remove_function("nvmlDeviceGetProcessUtilization")
    with pytest.raises(sim.NVMLError_FunctionNotFound):
        sim.nvmlDeviceGetProcessUtilization(sim.nvmlDeviceGetHandleByIndex(0), 0)


def test_the_environment_of_simulated_processes(clock):
    sim = machine("l4", clock)
    pid = sim.add_process(0, environ=lease_env("L1"))
    assert sim.process_environ(pid)[LEASE_ENV] == "L1"
    sim.remove_process(pid)
    assert sim.process_environ(pid) is None


# -- the reader ---------------------------------------------------------------------------------


def reader(clock: SecondsClock, node: str = "l4") -> tuple[SimNvml, NvmlReader]:
    sim = SimNvml.from_yaml(POOL, node, clock=clock)
    return sim, NvmlReader(sim, clock=clock)


def whole(samples: list[dict], index: int = 0) -> dict:
    return [s for s in samples if s["start"] is None][index]


def test_utilization_by_lease_on_a_shared_gpu(clock):
    sim, r = reader(clock)
    sim.add_process(0, load=BUSY, environ=lease_env("busy"))
    sim.add_process(
        0, load={"pattern": "steady", "level": 20, "jitter": 0}, environ=lease_env("busy")
    )
    sim.add_process(0, environ=lease_env("idle"))  # a context, no work
    s = whole(r.samples())
    assert s["util"] == 90.0  # the GPU is busy...
    assert s["lease_util"] == {"busy": 90.0, "idle": 0.0}  # ...because of one lease only
    clock.advance(5)
    assert whole(r.samples())["lease_util"] == {"busy": 90.0, "idle": 0.0}


def test_no_active_process_means_every_lease_at_zero(clock):
    sim, r = reader(clock)
    assert whole(r.samples())["lease_util"] == {}  # per-process samples work: nobody computes
    sim.add_process(0, environ=lease_env("L1"))
    assert whole(r.samples())["lease_util"] == {"L1": 0.0}


def test_activity_no_process_sample_explains_falls_back_to_the_whole_gpu(clock):
    """GPU 1 computes (its own load pattern) but no process sample says whose: never idle."""
    sim, r = reader(clock)
    sim.add_process(1, environ=lease_env("L1"))
    s = whole(r.samples(), 1)
    assert s["util"] == 30.0 and s["lease_util"] is None


def test_an_active_process_without_a_lease_falls_back_to_the_whole_gpu(clock, caplog):
    sim, r = reader(clock)
    sim.add_process(0, environ=lease_env("L1"))
    sim.add_process(0, load=BUSY)  # no GPUPOOL_LEASE_ID: whose work this is cannot be told
    with caplog.at_level(logging.WARNING):
        s = whole(r.samples())
        clock.advance(5)
        r.samples()
    assert s["lease_util"] is None and s["util"] == 70.0
    assert sum("belongs to no lease" in rec.message for rec in caplog.records) == 1


def test_a_gpu_without_per_process_samples_reports_none_and_is_asked_once(clock, caplog):
    sim, r = reader(clock, "old")
    calls = []
    real = sim.nvmlDeviceGetProcessUtilization

    def counted(handle, timeStamp):
        calls.append(timeStamp)
        return real(handle, timeStamp)

    sim.nvmlDeviceGetProcessUtilization = counted
    with caplog.at_level(logging.WARNING):
        assert whole(r.samples())["lease_util"] is None
        clock.advance(5)
        assert whole(r.samples())["lease_util"] is None
    assert len(calls) == 1
    assert any("NotSupported" in rec.message for rec in caplog.records)


def test_mig_samples_have_no_lease_util(clock):
    _, r = reader(clock, "amp")
    assert all("lease_util" not in s for s in r.samples())


def test_proc_environ_reads_this_process():
    import os

    env = proc_environ(os.getpid())
    if env is None:
        pytest.skip("no /proc here")
    assert env.get("PATH") == os.environ.get("PATH")
    assert proc_environ(2**22 + 12345) is None  # no such process


# -- the idle signal of a share -----------------------------------------------------------------

CATALOG = default_catalog()
OFFERS = {
    o.name: o
    for o in (
        parse_offer({"name": "quarter", "kind": "shared", "fraction": 0.25}, CATALOG),
        parse_offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}, CATALOG),
    )
}
POLICIES = PolicySet(
    default=ReclaimPolicy(idle_timeout=3600, pressure_idle_timeout=1200, warn_before=600)
)
W = 30.0


def window(t: float, sample: GpuSample) -> Signals:
    return Signals(
        t - W, t, "utilization", (sample,), KernelView(t, "idle"), PresenceView(t, None, 0)
    )


def plan(leases: list[LeaseInfo], sample: GpuSample, t: float):
    sigs = {le.id: window(t, sample) for le in leases}
    return plan_reclaims(leases, sigs, POLICIES, [], QuotaBook(), t, offers=OFFERS)


def share(lid: str, offer: str = "quarter") -> LeaseInfo:
    return LeaseInfo(lid, f"user-{lid}", offer, Fraction(1, 4), T0)


def test_an_idle_share_next_to_a_busy_neighbour_is_idle():
    gpu = GpuSample(T0 + W, 70.0, 4000, lease_util=(("busy", 70.0), ("idle", 0.0)))
    busy, idle = plan([share("busy"), share("idle")], gpu, T0 + W)
    assert isinstance(idle, NoAction) and idle.evidence.gpu == "idle"
    assert idle.state.idle_since == T0  # it counts towards its idle timeout
    assert busy.evidence.gpu == "busy" and busy.state.idle_since is None


def test_a_busy_share_next_to_an_idle_neighbour_is_busy():
    gpu = GpuSample(T0 + W, 65.0, lease_util=(("busy", 65.0),))  # "idle" has no process
    idle, busy = plan([share("idle"), share("busy")], gpu, T0 + W)
    assert busy.evidence.gpu == "busy"
    assert idle.evidence.gpu == "idle"


def test_without_per_process_samples_a_share_is_judged_by_the_whole_gpu():
    gpu = GpuSample(T0 + W, 70.0)  # the fallback: any activity on the GPU keeps every share
    a, b = plan([share("a"), share("b")], gpu, T0 + W)
    assert a.evidence.gpu == b.evidence.gpu == "busy"


def test_a_whole_gpu_lease_keeps_its_gpu_utilization():
    gpu = GpuSample(T0 + W, 70.0, lease_util=(("someone-else", 70.0),))
    [d] = plan([LeaseInfo("L1", "ann", "h100", Fraction(1), T0)], gpu, T0 + W)
    assert d.evidence.gpu == "busy"  # its GPU computes, whoever's process it is


def test_share_samples_and_source():
    mixed = (GpuSample(1.0, 50.0, lease_util=(("a", 50.0),)), GpuSample(2.0, 40.0))
    own = share_samples(mixed, "b")
    assert [s.util for s in own] == [0.0, 40.0]  # its own 0 %, then the fallback
    assert share_signal_source(mixed) == "utilization"
    assert share_signal_source(mixed[:1]) == "process"
