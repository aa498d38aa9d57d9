"""The pool's own alerts: the pure conditions and their raise/resolve rounds (``pool/alerts.py``),
and the service's evaluation on a real store (``service/alerts.py``): raised once, resolved
once, told to the notify hook with the documented payload, audited through the writer, on the
store's injectable clock."""

from __future__ import annotations

import asyncio
import logging
import shutil
from datetime import timezone
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.alerts import (
    RULES,
    Condition,
    Facts,
    Thresholds,
    conditions,
    pool_facts,
    step,
)
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.alerts import AlertMonitor, PoolAlerts
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.service.metrics import PoolMetrics
from jupyterhub_gpupool.service.notify import Notifier
from jupyterhub_gpupool.service.writer import BatchWriter
from tests.fakes import StoreClock, make_store

T = Thresholds()


def kinds(found: list[Condition]) -> set[tuple[str, str]]:
    return {c.key for c in found}


# -- the pure rules --------------------------------------------------------------------------


def test_each_condition_holds_past_its_threshold_and_not_at_it():
    quiet = Facts(
        oldest_wait={"h100": T.queue_wait},
        idle_hours={"ml": T.idle_unit_hours},
        budget_used={"group:ml": 0.79},
        reclaim_failures=T.reclaim_failures - 1,
        requests=T.min_requests,
        errors=int(T.error_ratio * T.min_requests),  # exactly the share: not above it
    )
    assert conditions(quiet, T) == []
    loud = Facts(
        unhealthy_gpus=["n1/GPU-a"],
        unreachable_nodes=["n2"],
        mig_failures=1,
        oldest_wait={"h100": T.queue_wait + 1, "a100": 10},
        exhausted=["h100"],
        idle_hours={"ml": T.idle_unit_hours + 0.5, "bio": 1},
        budget_used={"group:ml": 0.8, "user:ada": 1.0, "user:bo": 0.2},
        reclaim_failures=T.reclaim_failures,
        requests=T.min_requests,
        errors=2,
    )
    assert kinds(conditions(loud, T)) == {
        ("gpu_unhealthy", "n1/GPU-a"),
        ("node_unreachable", "n2"),
        ("mig_failed", "pool"),
        ("queue_stalled", "h100"),
        ("offer_exhausted", "h100"),
        ("idle_gpu_hours", "ml"),
        ("budget_80", "group:ml"),
        ("budget_100", "user:ada"),
        ("reclaim_failing", "pool"),
        ("server_errors", "pool"),
    }
    # a high share of very few requests is not judged
    assert conditions(Facts(requests=T.min_requests - 1, errors=T.min_requests - 1), T) == []
    # without the database, that is all anyone knows
    assert kinds(conditions(Facts(store_up=False, unreachable_nodes=["n2"]), T)) == {
        ("store_unavailable", "pool")
    }


def test_step_raises_once_after_the_pending_time_and_resolves_once():
    exhausted = [Condition("offer_exhausted", "h100")]
    hold = RULES["offer_exhausted"].for_s
    first = step({}, exhausted, 1000.0)
    assert first.raised == [] and first.alerts[("offer_exhausted", "h100")].since == 1000.0
    almost = step(first.alerts, exhausted, 1000.0 + hold - 1)
    assert almost.raised == []
    fired = step(almost.alerts, exhausted, 1000.0 + hold)
    assert [a.key for a in fired.raised] == [("offer_exhausted", "h100")]
    assert fired.raised[0].since == 1000.0  # since the condition began, as Prometheus says
    again = step(fired.alerts, exhausted, 1000.0 + hold + 30)
    assert again.raised == [] and again.resolved == []  # no repeat every round
    gone = step(again.alerts, [], 1000.0 + hold + 60)
    assert [a.key for a in gone.resolved] == [("offer_exhausted", "h100")] and not gone.alerts
    assert step(gone.alerts, [], 1000.0 + hold + 90).resolved == []  # resolved once
    # a condition that stops before its pending time is neither raised nor resolved
    brief = step(step({}, exhausted, 0.0).alerts, [], 10.0)
    assert brief.raised == [] and brief.resolved == [] and not brief.alerts


def test_budget_moves_from_the_80_to_the_100_alert():
    at = step({}, conditions(Facts(budget_used={"group:ml": 0.85}), T), 0.0)
    assert [a.kind for a in at.raised] == ["budget_80"]
    spent = step(at.alerts, conditions(Facts(budget_used={"group:ml": 1.2}), T), 60.0)
    assert [a.kind for a in spent.raised] == ["budget_100"]
    assert [a.kind for a in spent.resolved] == ["budget_80"]


# -- on a real store -------------------------------------------------------------------------

POOL: dict[str, Any] = {
    "nodes": [{"name": "h100", "gpus": [{"model": "H100-80GB", "count": 1}]}],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {
        "default": {"guarantee": 1, "limit": 1},
        "groups": {"ml": {"guarantee": 1, "limit": 1, "budget": 2}},
    },
}


@pytest.fixture
def store(db_url: str, clock: StoreClock):
    upgrade(db_url)
    return make_store(db_url, clock, pool=POOL)


def test_pool_facts_read_the_queue_health_and_budgets(store, clock):
    store.put_inventory(node_from_inventory("h100", _inv(False), store.catalog))
    with store.locked() as alloc:
        facts = pool_facts(alloc, epoch(clock))
    assert facts.unhealthy_gpus == [f"h100/{gpu_uuid('h100', 0)}"]
    store.put_inventory(node_from_inventory("h100", _inv(True), store.catalog))
    held = store.allocate("ada", "", "h100", groups=["ml"], group="ml")
    store.keepalive(held.id)
    store.allocate("bo", "", "h100")
    clock.advance(minutes=90)
    store.budget_refresh = 0  # recount the budget hours at the next write
    store.expire_grants()
    with store.locked() as alloc:
        facts = pool_facts(alloc, epoch(clock))
    assert facts.exhausted == ["h100"]
    assert facts.oldest_wait["h100"] == pytest.approx(90 * 60, abs=1)
    # 1.5 of the group's 2 unit-hours: three quarters (the reference: held hours / budget)
    assert facts.budget_used == {"group:ml": pytest.approx(0.75)}


def epoch(clock: StoreClock) -> float:
    return clock().replace(tzinfo=timezone.utc).timestamp()


def _inv(healthy: bool) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "uuid": gpu_uuid("h100", 0),
                "index": 0,
                "model": "NVIDIA H100 80GB HBM3",
                "memory_mib": 81920,
                "healthy": healthy,
            }
        ]
    }


class Recorder:
    """A notify hook that keeps what it was told (the real Notifier calls it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict, dict]] = []

    async def __call__(self, event: str, lease: dict, details: dict) -> None:
        self.calls.append((event, lease, details))


def monitor_for(store, hook: Recorder) -> tuple[AlertMonitor, BatchWriter, Notifier]:
    writer = BatchWriter(store)
    writer.start()
    notifier = Notifier(hook, 5.0, logging.getLogger("test"))
    monitor = AlertMonitor(
        store,
        writer.run,
        notifier,
        PoolMetrics(),
        PoolAlerts().thresholds(),
        actor="service:gpupool",
    )
    return monitor, writer, notifier


def audited(store) -> list[tuple[str, str]]:
    items, _ = store.events()
    return [(e.kind, e.data["kind"]) for e in items if e.kind.startswith("alert-")]


def test_an_unhealthy_gpu_is_raised_once_resolved_once_notified_and_audited(store, clock):
    hook = Recorder()
    monitor, writer, notifier = monitor_for(store, hook)

    async def scenario() -> None:
        assert (await monitor.round()).raised == []
        await writer.run(
            commands.PutInventory(node_from_inventory("h100", _inv(False), store.catalog))
        )
        clock.advance(seconds=30)
        raised = (await monitor.round()).raised
        assert [a.kind for a in raised] == ["gpu_unhealthy"]
        for _ in range(3):  # it stays in force, and is told once
            clock.advance(seconds=30)
            assert (await monitor.round()).raised == []
        active = monitor.active()
        assert [a["kind"] for a in active] == ["gpu_unhealthy"]
        assert active[0]["since"] == "2026-03-02T09:00:30Z" and active[0]["page"] == "nodes"
        await writer.run(
            commands.PutInventory(node_from_inventory("h100", _inv(True), store.catalog))
        )
        clock.advance(seconds=30)
        assert [a.kind for a in (await monitor.round()).resolved] == ["gpu_unhealthy"]
        clock.advance(seconds=30)
        assert (await monitor.round()).resolved == []
        await notifier.drain()

    try:
        asyncio.run(scenario())
    finally:
        writer.stop()
    assert [c[0] for c in hook.calls] == ["alert", "alert-resolved"]
    _event, lease, details = hook.calls[0]
    assert lease == {}
    subject = f"h100/{gpu_uuid('h100', 0)}"
    assert details["for"] == "admins"
    assert {k: details[k] for k in ("kind", "severity", "subject", "since")} == {
        "kind": "gpu_unhealthy",
        "severity": "critical",
        "subject": subject,
        "since": "2026-03-02T09:00:30Z",
    }
    assert hook.calls[1][2]["resolved"] == "2026-03-02T09:02:30Z"
    assert audited(store) == [
        ("alert-raised", "gpu_unhealthy"),
        ("alert-resolved", "gpu_unhealthy"),
    ]
    assert monitor.active() == []


def test_the_database_away_raises_its_alert_and_audits_it_once_back(tmp_path: Path, clock):
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder}/pool.sqlite"
    upgrade(url)
    store = make_store(url, clock, pool=POOL)
    hook = Recorder()
    monitor, writer, notifier = monitor_for(store, hook)

    async def scenario() -> None:
        await writer.run(
            commands.PutInventory(node_from_inventory("h100", _inv(False), store.catalog))
        )
        assert [a.kind for a in (await monitor.round()).raised] == ["gpu_unhealthy"]
        hook.calls.clear()
        shutil.move(folder, tmp_path / "away")  # the database file is gone from its path
        store.engine.dispose()
        clock.advance(seconds=30)
        assert (await monitor.round()).raised == []  # pending: held 60 s before it is raised
        clock.advance(seconds=60)
        assert [a.kind for a in (await monitor.round()).raised] == ["store_unavailable"]
        assert len(monitor.unwritten) == 1  # could not be audited meanwhile
        # what cannot be judged without the database stays as it was (not resolved)
        assert {a["kind"] for a in monitor.active()} == {"gpu_unhealthy", "store_unavailable"}
        shutil.move(tmp_path / "away", folder)
        clock.advance(seconds=30)
        assert [a.kind for a in (await monitor.round()).resolved] == ["store_unavailable"]
        assert monitor.unwritten == []
        await notifier.drain()

    try:
        asyncio.run(scenario())
    finally:
        writer.stop()
    assert [(c[0], c[2]["kind"]) for c in hook.calls] == [
        ("alert", "store_unavailable"),
        ("alert-resolved", "store_unavailable"),
    ]
    assert audited(store) == [
        ("alert-raised", "gpu_unhealthy"),
        ("alert-raised", "store_unavailable"),
        ("alert-resolved", "store_unavailable"),
    ]
    assert [a["kind"] for a in monitor.active()] == ["gpu_unhealthy"]


def test_a_replica_that_does_not_lead_keeps_no_alert(store, clock):
    store.put_inventory(node_from_inventory("h100", _inv(False), store.catalog))
    hook = Recorder()
    monitor, writer, _notifier = monitor_for(store, hook)
    monitor.leader = lambda: False
    try:
        asyncio.run(monitor.round())
    finally:
        writer.stop()
    assert monitor.active() == [] and hook.calls == []


def test_the_service_counts_5xx_over_five_minutes(store, clock):
    hook = Recorder()
    monitor, writer, _notifier = monitor_for(store, hook)
    metrics = monitor.metrics

    async def scenario() -> None:
        await monitor.round()
        for status in [200] * 18 + [500] * 2:  # 10 %, 20 requests
            metrics.observe_request("GET", "offers", status, 0.001)
        clock.advance(seconds=60)
        await monitor.round()  # pending (5 minutes)
        assert monitor.alerts[("server_errors", "pool")].firing is False
        for _ in range(5):
            clock.advance(seconds=60)
            for status in [200] * 18 + [503] * 2:
                metrics.observe_request("GET", "offers", status, 0.001)
            await monitor.round()
        assert [a["kind"] for a in monitor.active()] == ["server_errors"]
        for _ in range(6):  # healthy answers only: the share drops below 5 %
            clock.advance(seconds=60)
            for _ in range(40):
                metrics.observe_request("GET", "offers", 200, 0.001)
            await monitor.round()
        assert monitor.active() == []

    try:
        asyncio.run(scenario())
    finally:
        writer.stop()


# -- the metrics the Prometheus rules read -------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_the_rules_metrics_say_what_the_service_judges(tmp_path: Path, clock):
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder}/pool.sqlite"
    upgrade(url)
    store = make_store(url, clock, pool=POOL)
    metrics = PoolMetrics(usage_refresh=0)
    held = store.allocate("ada", "", "h100", groups=["ml"], group="ml")
    store.keepalive(held.id)
    store.allocate("bo", "", "h100")
    clock.advance(minutes=90)
    store.budget_refresh = 0
    store.expire_grants()
    store.put_inventory(node_from_inventory("h100", _inv(False), store.catalog))
    text = metrics.render(store).decode()
    gpu = gpu_uuid("h100", 0)
    assert sample(text, "gpupool_store_up") == 1
    assert sample(text, "gpupool_gpu_unhealthy", node="h100", gpu=gpu) == 1
    assert sample(text, "gpupool_queue_oldest_wait_seconds", offer="h100") == 90 * 60
    assert sample(text, "gpupool_budget_used_ratio", quota="group:ml") == pytest.approx(0.75)
    # 1.5 unit-hours held, no busy sample: all of it idle (held minus busy)
    assert sample(text, "gpupool_group_idle_unit_hours_24h", group="ml") == pytest.approx(1.5)
    assert sample(text, "gpupool_reclaim_outcomes_total", result="failed") == 0
    assert sample(text, "gpupool_mig_failures_total") == 0
    metrics.observe_request("GET", "offers", 503, 0.01)
    metrics.observe_request("GET", "offers", 200, 0.01)
    text = metrics.render(store).decode()
    assert sample(text, "gpupool_api_requests_total") == 2
    assert sample(text, "gpupool_api_server_errors_total") == 1
    # the database away: store_up says so, the rest keeps its last values, no error
    shutil.move(folder, tmp_path / "away")
    store.engine.dispose()
    text = metrics.render(store).decode()
    assert sample(text, "gpupool_store_up") == 0
    assert sample(text, "gpupool_gpu_unhealthy", node="h100", gpu=gpu) == 1


def test_a_bad_alert_setting_is_one_line_and_a_failed_start(tmp_path: Path):
    import subprocess
    import sys

    done = subprocess.run(
        [
            *(sys.executable, "-m", "jupyterhub_gpupool.cli", "service"),
            f"--db-url=sqlite:///{tmp_path}/pool.sqlite",
            "--PoolAlerts.budget_warn=1.5",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "jupyterhub-gpupool service: error: The value of the 'budget_warn' trait of a "
        "PoolAlerts instance should not be greater than 1.0, but a value of 1.5 was specified"
    ]
