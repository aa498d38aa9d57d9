"""The node agent's NVML reader, run on the simulated NVML."""

from __future__ import annotations

import logging

import pytest

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.telemetry import simnvml
from jupyterhub_gpupool.telemetry.nvml import PENDING_LABEL, NvmlReader, NvmlUnavailable
from jupyterhub_gpupool.telemetry.simnvml import SimNvml
from tests.fakes import SecondsClock

DEMO = data_path("demo-pool.yaml")

POOL = """
nodes:
  - name: amp
    gpus:
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 3g.40gb, start: 0}, {profile: 1g.10gb, start: 6}]
        load: {instances: {0: {pattern: steady, level: 70, memory: 0.25}}}
  - name: hop
    gpus:
      - model: H100-80GB
        mig:
          enabled: true
          instances: [{profile: 3g.40gb, start: 0}, {profile: 3g.40gb, start: 4}]
        load: {instances: {0: {pattern: steady, level: 80, jitter: 0}, 4: idle}}
      - {model: H100-80GB, load: {pattern: steady, level: 40, jitter: 0, memory: 0.5}}
"""


T0 = 2_000_000.0


@pytest.fixture
def clock() -> SecondsClock:
    """The simulated NVML's clock (seconds), at ``T0``: it moves only when the test moves it."""
    return SecondsClock(T0)


def reader(source, node: str, clock: SecondsClock, **kw) -> tuple[SimNvml, NvmlReader]:
    sim = SimNvml.from_yaml(source, node, clock=clock)
    return sim, NvmlReader(sim, clock=clock, **kw)


@pytest.mark.parametrize(
    ("node", "model", "count", "mig"),
    [
        ("sim-a100", "NVIDIA A100-SXM4-80GB", 2, True),
        ("sim-h100", "NVIDIA H100 80GB HBM3", 2, False),
        ("sim-t4", "Tesla T4", 1, False),
    ],
)
def test_demo_pool_inventory_per_node(clock, node, model, count, mig):
    _, r = reader(DEMO, node, clock, dynamic_mig=True)
    inv = r.inventory()
    assert [g["model"] for g in inv["gpus"]] == [model] * count
    assert [g["uuid"] for g in inv["gpus"]] == [gpu_uuid(node, i) for i in range(count)]
    for g in inv["gpus"]:
        assert g["mig"] == {"enabled": mig, "dynamic": mig, "instances": []}
        assert g["healthy"] is True and g["memory_mib"] > 0
    assert set(inv) == {"labels", "gpus"}
    assert inv["labels"]["gpupool.jupyter.org/nvidia-driver"]


def test_inventory_lists_mig_instances_with_catalog_names(clock):
    sim, r = reader(POOL, "amp", clock)
    (gpu,) = r.inventory()["gpus"]
    insts = gpu["mig"]["instances"]
    assert [(i["profile"], i["start"]) for i in insts] == [("3g.40gb", 0), ("1g.10gb", 6)]
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    migs = {
        sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)) for i in (0, 1)
    }
    assert {i["uuid"] for i in insts} == migs
    assert gpu["mig"]["dynamic"] is False


def test_pending_mig_mode_is_a_label(clock):
    sim, r = reader(POOL, "hop", clock)
    sim.set_mig_pending(1, simnvml.NVML_DEVICE_MIG_ENABLE)
    labels = r.inventory()["labels"]
    assert labels[PENDING_LABEL.format(index=1)] == "enabled"
    assert PENDING_LABEL.format(index=0) not in labels


def test_samples_a100_mig_util_unknown_memory_known(clock):
    _, r = reader(POOL, "amp", clock)
    samples = r.samples()
    assert [(s["start"], s["util"]) for s in samples] == [(0, None), (6, None)]
    assert samples[0]["memory_used_mib"] == 10 * 1024  # a quarter of 40 GB
    assert samples[1]["memory_used_mib"] == 0
    assert all(s["ts"] == clock.now for s in samples)


def test_samples_h100_mig_gpm_util_from_second_reading(clock):
    _, r = reader(POOL, "hop", clock)
    first = r.samples()
    mig = [s for s in first if s["start"] is not None]
    assert [(s["start"], s["util"]) for s in mig] == [(0, None), (4, None)]
    whole = [s for s in first if s["start"] is None]
    assert [s["util"] for s in whole] == [40.0]
    assert whole[0]["memory_used_mib"] == 40 * 1024
    clock.now += 0.05  # too close for GPM: still unknown, the older sample is kept
    assert [s["util"] for s in r.samples() if s["start"] is not None] == [None, None]
    clock.now += 30
    by_start = {s["start"]: s["util"] for s in r.samples()}
    assert by_start[0] == pytest.approx(80.0)
    assert by_start[4] == 0.0


def test_mig_samples_count_the_instance_processes(clock):
    """Ampere MIG has no utilization: the processes on each instance are the idle signal."""
    sim, r = reader(POOL, "amp", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1))
    assert [s["processes"] for s in r.samples()] == [0, 0]
    sim.add_process(mig_uuid, used_mib=512)
    sim.add_process(mig_uuid, used_mib=256)
    by_start = {s["start"]: s for s in r.samples()}
    assert by_start[6]["processes"] == 2
    assert by_start[6]["memory_used_mib"] == 768
    assert by_start[0]["processes"] == 0


def test_whole_gpu_util_follows_the_load(clock):
    sim, r = reader(DEMO, "sim-t4", clock)
    sim.set_load(0, {"pattern": "steady", "level": 75, "jitter": 0})
    assert r.samples()[0]["util"] == 75.0


def test_processes_per_gpu_and_instance(clock):
    sim, r = reader(POOL, "hop", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1))
    p1 = sim.add_process(mig_uuid, used_mib=512)
    p2 = sim.add_process(1, used_mib=2048)
    procs = {p["pid"]: p for p in r.processes()}
    assert procs[p1]["mig_uuid"] == mig_uuid and procs[p1]["memory_used_mib"] == 512
    assert procs[p1]["start"] == 4
    assert procs[p2]["start"] is None and procs[p2]["gpu"] == gpu_uuid("hop", 1)


def test_lost_gpu_is_reported_unhealthy_and_logged_once(clock, caplog):
    sim, r = reader(POOL, "hop", clock)
    assert all(g["healthy"] for g in r.inventory()["gpus"])
    sim.set_lost(1)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            inv = r.inventory()
            samples = r.samples()
    assert [g["healthy"] for g in inv["gpus"]] == [True, False]
    assert inv["gpus"][1]["uuid"] == gpu_uuid("hop", 1)
    assert all(s["gpu"] != gpu_uuid("hop", 1) for s in samples)
    assert sum("GpuIsLost" in rec.message for rec in caplog.records) == 1
    assert [h["lost"] for h in r.health()] == [False, True]


def test_ecc_errors_make_a_gpu_unhealthy(clock):
    sim, r = reader(DEMO, "sim-t4", clock)
    sim.set_ecc_errors(0, 2)
    assert r.inventory()["gpus"][0]["healthy"] is False
    assert r.health()[0]["ecc_uncorrected"] == 2


def test_old_driver_without_gpm_gives_unknown_util(clock, caplog):
    sim, r = reader(POOL, "hop", clock)
    sim.remove_function("nvmlGpmQueryDeviceSupport")
    sim.remove_function("nvmlDeviceGetTemperature")
    with caplog.at_level(logging.WARNING):
        r.samples()
        clock.now += 10
        samples = r.samples()
    assert [s["util"] for s in samples if s["start"] is not None] == [None, None]
    assert r.health()[0]["temperature_c"] is None
    assert any("FunctionNotFound" in rec.message for rec in caplog.records)


def test_missing_library_is_a_clear_error():
    class Broken:
        NVMLError = simnvml.NVMLError

        def nvmlInit(self):
            raise simnvml.NVMLError(simnvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(NvmlUnavailable, match=r"LibraryNotFound.*libnvidia-ml"):
        NvmlReader(Broken())


def test_apply_mig_plan_end_to_end(clock):
    sim, r = reader(DEMO, "sim-a100", clock, dynamic_mig=True)
    gpu = gpu_uuid("sim-a100", 0)
    results = r.apply_mig_plan(
        [
            {"op": "create", "gpu": gpu, "profile": "3g.40gb", "start": 4},
            {"op": "create", "gpu": gpu, "profile": "1g.10gb", "start": 0},
            {"op": "create", "gpu": gpu, "profile": "2g.20gb", "start": 4},  # overlaps
            {"op": "create", "gpu": gpu, "profile": "9g.1tb", "start": 0},
            {"op": "create", "gpu": "GPU-nope", "profile": "1g.10gb", "start": 0},
            {"op": "resize", "gpu": gpu, "start": 0},
        ]
    )
    assert [x["ok"] for x in results] == [True, True, False, False, False, False]
    assert [x["error"] for x in results[2:]] == [
        "InsufficientResources",
        "UnknownProfile",
        "NotFound",
        "InvalidAction",
    ]
    assert results[0]["mig_uuid"].startswith("MIG-")
    inst = r.inventory()["gpus"][0]["mig"]["instances"]
    assert [(i["profile"], i["start"], i["uuid"]) for i in inst] == [
        ("1g.10gb", 0, results[1]["mig_uuid"]),
        ("3g.40gb", 4, results[0]["mig_uuid"]),
    ]
    pid = sim.add_process(results[0]["mig_uuid"])
    refused = r.apply_mig_plan([{"op": "destroy", "gpu": gpu, "start": 4}])
    assert refused == [{"ok": False, "error": "InUse", "mig_uuid": None}]
    sim.remove_process(pid)
    done = r.apply_mig_plan(
        [{"op": "destroy", "gpu": gpu, "start": 4}, {"op": "destroy", "gpu": gpu, "start": 4}]
    )
    assert [(d["ok"], d["error"]) for d in done] == [(True, None), (False, "NotFound")]
    inst = r.inventory()["gpus"][0]["mig"]["instances"]
    assert [(i["profile"], i["start"]) for i in inst] == [("1g.10gb", 0)]


def test_apply_mig_plan_on_a_non_mig_gpu(clock):
    _, r = reader(DEMO, "sim-h100", clock)
    (res,) = r.apply_mig_plan(
        [{"op": "create", "gpu": gpu_uuid("sim-h100", 0), "profile": "1g.10gb", "start": 0}]
    )
    assert res == {"ok": False, "error": "NotSupported", "mig_uuid": None}


def test_close_frees_gpm_samples_and_shuts_down(clock):
    sim, r = reader(POOL, "hop", clock)
    r.samples()
    r.close()
    with pytest.raises(simnvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
