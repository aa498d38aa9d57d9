"""``jupyterhub-gpupool demo --short-reclaim``: the demo's pool file gets the short reclaim
section, it validates against the demo's offers, and through the pool's own rules a GPU left
idle (no kernel busy, nobody at the keyboard) gets its notice within two minutes, at 30 s
rounds as the reclaimer runs them, and is reclaimed a minute later."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from jupyterhub_gpupool.demo import SHORT_RECLAIM, add_arguments, prepare
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.kernels import KernelRules, kernel_verdict
from jupyterhub_gpupool.pool.quota import QuotaBook
from jupyterhub_gpupool.pool.reclaim import (
    Act,
    GpuSample,
    KernelView,
    LeaseInfo,
    NoAction,
    Notice,
    PresenceView,
    Signals,
    parse_policies,
    plan_reclaims,
)
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.service.app import PoolService

ROUND = 30.0  # the reclaimer's round interval (ReclaimerApp.interval's default)
PORTS = {"proxy API": 18001, "hub API": 18081, "pool service": 20101}


def demo_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        ["--gpus", "sim", "--state-dir", str(tmp_path / "state"), "--proxy", "chp", *extra]
    )


def idle_window(t: float) -> Signals:
    """A round's window ending at ``t``: GPU at 0 %, kernel idle, browser closed."""
    return Signals(
        t - ROUND,
        t,
        "utilization",
        (GpuSample(t - ROUND / 2, 0.0), GpuSample(t, 0.0)),
        KernelView(t, "idle"),
        PresenceView(t, None, 0),
    )


def test_the_switch_writes_the_short_policy_and_a_notice_comes_within_two_minutes(tmp_path):
    args = demo_args(tmp_path, "--short-reclaim")
    env, state = prepare(args, PORTS)
    written = Path(env["GPUPOOL_DEMO_POOL"])
    assert written == state / "pool-short-reclaim.yaml"
    raw = yaml.safe_load(written.read_text())
    assert raw["reclaim"] == SHORT_RECLAIM
    catalog = default_catalog()
    config = parse_pool_config(raw, catalog)  # the rest of the demo pool is unchanged
    offers = {o.name: o for o in config.offers}
    assert {"h100", "a100-1g", "t4-quarter"} <= set(offers)
    policies = parse_policies(raw["reclaim"], offers, "reclaim", catalog)
    lease = LeaseInfo("L1", "alice", "h100", offers["h100"].count, granted_at=0.0)
    t0 = 1000.0  # alice closes her browser; from here every round sees an idle lease
    t = t0
    notice_at = act_at = None
    while t <= t0 + 600:
        t += ROUND
        [d] = plan_reclaims(
            [lease], {"L1": idle_window(t)}, policies, [], QuotaBook(), t, offers=offers
        )
        lease = LeaseInfo(
            lease.id, lease.user, lease.offer, lease.units, lease.granted_at, state=d.state
        )
        if isinstance(d, Notice) and notice_at is None:
            notice_at = t
            assert d.reclaiming.kind == "idle" and d.reclaiming.action == "stop"
        elif isinstance(d, Act):
            act_at = t
            break
        else:
            assert isinstance(d, NoAction), d
    assert notice_at is not None and notice_at - t0 <= 120
    assert act_at is not None and act_at - notice_at <= 90


def test_without_the_switch_the_demo_pool_is_used_as_it_is(tmp_path):
    env, _ = prepare(demo_args(tmp_path), PORTS)
    assert Path(env["GPUPOOL_DEMO_POOL"]).name == "demo-pool.yaml"
    assert "reclaim" not in yaml.safe_load(Path(env["GPUPOOL_DEMO_POOL"]).read_text())


def test_the_switch_gives_gpu_kernels_short_timers_the_service_takes(tmp_path):
    """``--short-reclaim`` also passes the pool service its GPU-kernel timers: the service's
    own command line takes them, and through the pool's kernel rule a kernel that ran nothing
    for a minute gets its notice, and is reclaimed a minute after that."""
    env, _ = prepare(demo_args(tmp_path, "--short-reclaim"), PORTS)
    plain, _ = prepare(demo_args(tmp_path / "plain"), PORTS)
    assert plain["GPUPOOL_DEMO_SERVICE_ARGS"] == ""
    service = PoolService()
    service.parse_command_line(env["GPUPOOL_DEMO_SERVICE_ARGS"].split())
    assert (service.kernel_idle_timeout, service.kernel_notice) == (60.0, 60.0)
    rules = KernelRules(service.kernel_idle_timeout, service.kernel_notice)
    busy = 1000.0  # the kernel's last cell; it reports every few seconds from then on
    assert kernel_verdict(busy + 59, busy + 59, busy, None, rules) == "keep"
    assert kernel_verdict(busy + 60, busy + 60, busy, None, rules) == "notice"
    deadline = busy + 60 + service.kernel_notice
    assert kernel_verdict(deadline - 1, deadline - 1, busy, deadline, rules) == "keep"
    assert kernel_verdict(deadline, deadline, busy, deadline, rules) == "reclaim"
