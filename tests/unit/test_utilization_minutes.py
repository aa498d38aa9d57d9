"""One-minute utilization aggregates: the math, minute boundaries, the upsert and retention."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import load_pool_config
from jupyterhub_gpupool.service.ingest import ingest
from jupyterhub_gpupool.service.telemetry_loop import LocalTelemetry
from jupyterhub_gpupool.service.utilization import (
    MinuteAggregator,
    MinuteStats,
    Sample,
    UtilizationBuffer,
    epoch,
    minute_of,
)
from jupyterhub_gpupool.service.writer import BatchWriter
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.utilization import MinuteView
from jupyterhub_gpupool.telemetry.nvml import NvmlReader
from jupyterhub_gpupool.telemetry.simnvml import SimNvml

T0 = 1_800_000_000.0  # a whole minute (2027-01-15T08:00:00Z)
M0 = datetime(2027, 1, 15, 8, 0)


def s(ts: float, util: float | None, mem: int = 0, gpu: str = "GPU-a", start=None) -> Sample:
    return Sample(ts, gpu, start, util, mem)


def test_minute_boundaries():
    assert minute_of(T0) == M0 and epoch(M0) == T0
    assert minute_of(T0 + 59.999) == M0
    assert minute_of(T0 + 60) == M0 + timedelta(minutes=1)
    assert minute_of(T0 - 0.001) == M0 - timedelta(minutes=1)


def test_stats_mean_counts_only_known_utilization():
    stats = MinuteStats()
    for sample in (s(T0, 10.0, 100), s(T0 + 5, None, 300), s(T0 + 10, 40.0, 200)):
        stats.add(sample)
    assert (stats.samples, stats.util_samples) == (3, 2)
    assert stats.util_mean == pytest.approx(25.0) and stats.util_max == 40.0
    assert stats.memory_used_mib_max == 300
    empty = MinuteStats()
    empty.add(s(T0, None))
    assert empty.util_mean is None and empty.util_max is None


def test_aggregator_splits_by_device_and_minute_and_restores():
    agg = MinuteAggregator()
    for sample in (
        s(T0 + 1, 10.0),
        s(T0 + 59.5, 30.0),
        s(T0 + 60, 90.0),
        s(T0 + 2, 50.0, start=3),
    ):
        agg.add(sample)
    taken = agg.take()
    assert agg.pending == {}
    assert taken[("GPU-a", -1, M0)].samples == 2
    assert taken[("GPU-a", -1, M0)].util_mean == pytest.approx(20.0)
    assert taken[("GPU-a", -1, M0 + timedelta(minutes=1))].util_max == 90.0
    assert taken[("GPU-a", 3, M0)].samples == 1
    agg.add(s(T0 + 3, 70.0))  # arrives while a failed write is being put back
    agg.restore(taken)
    assert agg.pending[("GPU-a", -1, M0)].samples == 3
    assert agg.pending[("GPU-a", -1, M0)].util_mean == pytest.approx(110 / 3)


def _stats(*samples: Sample) -> MinuteStats:
    out = MinuteStats()
    for sample in samples:
        out.add(sample)
    return out


def test_upsert_merges_partial_minutes(db_url):
    upgrade(db_url)
    store = Store(make_engine(db_url), default_catalog())
    key = ("GPU-a", -1, M0)
    mig = ("GPU-a", 2, M0)
    first = {key: _stats(s(T0, 10.0, 100), s(T0 + 5, 20.0, 500)), mig: _stats(s(T0, None, 7))}
    assert store.write_minutes(first) == 2
    second = {key: _stats(s(T0 + 30, 60.0, 200), s(T0 + 35, None, 50)), mig: _stats(s(T0, None))}
    store.write_minutes(second)
    store.write_minutes({mig: _stats(s(T0 + 40, 80.0, 1))})
    rows = store.minutes(None, M0 - timedelta(hours=1))
    assert rows == [
        MinuteView(
            minute=M0,
            gpu="GPU-a",
            start=None,
            samples=4,
            util_mean=pytest.approx(30.0),
            util_max=60.0,
            memory_used_mib_max=500,
        ),
        MinuteView(
            minute=M0,
            gpu="GPU-a",
            start=2,
            samples=3,
            util_mean=pytest.approx(80.0),
            util_max=80.0,
            memory_used_mib_max=7,
        ),
    ]
    assert [r.start for r in store.minutes([("GPU-a", 2)], M0)] == [2]
    assert store.minutes([("GPU-b", None)], M0) == []
    assert store.minutes([], M0) == []
    assert store.minutes(None, M0 + timedelta(minutes=1)) == []
    assert store.minutes(None, M0, M0 - timedelta(minutes=1)) == []


def test_retention_deletes_only_older_minutes(db_url):
    upgrade(db_url)
    store = Store(make_engine(db_url), default_catalog())
    days = {d: ("GPU-a", -1, M0 - timedelta(days=d)) for d in (0, 29, 31, 400)}
    store.write_minutes({k: _stats(s(T0, 1.0)) for k in days.values()})
    assert store.prune_minutes(M0 - timedelta(days=30)) == 2
    left = store.minutes(None, datetime(2000, 1, 1))
    assert [r.minute for r in left] == [days[29][2], days[0][2]]
    assert store.prune_minutes(M0 - timedelta(days=30)) == 0


def test_in_process_loop_feeds_minutes_across_a_boundary(sqlite_url, demo_pool_file):
    """The sim reader on an injected clock, through the loop the service runs in-process."""
    upgrade(sqlite_url)
    catalog = default_catalog()
    store = Store(make_engine(sqlite_url), catalog)
    store.load_config(load_pool_config(str(demo_pool_file), catalog))
    now = [T0 + 30]
    machine = SimNvml.from_yaml(demo_pool_file, "sim-h100", clock=lambda: now[0])
    reader = NvmlReader(machine, clock=lambda: now[0])
    buffer, minutes = UtilizationBuffer(), MinuteAggregator()
    writer = BatchWriter(store)
    writer.start()
    loop = LocalTelemetry({"sim-h100": reader}, store, writer, buffer, minutes)

    async def run() -> None:
        assert await loop.check_inventory("sim-h100")
        assert not await loop.check_inventory("sim-h100")  # unchanged: not put again
        for t in (T0 + 30, T0 + 45, T0 + 59.9, T0 + 60, T0 + 60):  # the last is a duplicate
            now[0] = t
            await loop.collect("sim-h100")

    try:
        asyncio.run(run())
    finally:
        writer.stop()
    gpus = sorted({k[0] for k in minutes.pending})
    assert len(gpus) == 2
    counts = {(k[0], k[2]): v.samples for k, v in minutes.pending.items()}
    for gpu in gpus:
        assert counts[(gpu, M0)] == 3 and counts[(gpu, M0 + timedelta(minutes=1))] == 1
    store.write_minutes(minutes.take())
    rows = store.minutes([(gpus[0], None)], M0)
    assert [(r.minute, r.samples) for r in rows] == [(M0, 3), (M0 + timedelta(minutes=1), 1)]
    assert all(r.util_mean is not None for r in rows)


def per_lease(facts):
    """Busy hours per lease of ``ingest``'s (lease, hour) facts."""
    out = {}
    for (lease, _), (busy, _) in facts.items():
        out[lease] = out.get(lease, 0.0) + busy / 3600
    return out


def test_busy_hours_of_shares_follow_their_own_processes(sqlite_url, demo_pool_file):
    """Two quarters of one T4: with per-process figures only the share that computes gets busy
    hours; a sample without them (older GPU, untrusted) counts for both, as the reclaimer's
    fallback does."""
    upgrade(sqlite_url)
    catalog = default_catalog()
    store = Store(make_engine(sqlite_url), catalog)
    store.load_config(load_pool_config(str(demo_pool_file), catalog))
    busy_share = store.allocate("alice", "", "t4-quarter")
    idle_share = store.allocate("bob", "", "t4-quarter")
    gpu = busy_share.slots[0].gpu
    assert idle_share.slots[0].gpu == gpu
    own = ((busy_share.id, 60.0), (idle_share.id, 0.0))
    buffer = UtilizationBuffer()
    batch = [Sample(T0 + t, gpu, None, 60.0, 0, lease_util=own) for t in (0, 30)]
    assert per_lease(ingest(store, buffer, batch, 5.0)) == {busy_share.id: pytest.approx(30 / 3600)}
    fallback = [Sample(T0 + 60, gpu, None, 60.0, 0)]
    assert per_lease(ingest(store, buffer, fallback, 5.0)) == {
        busy_share.id: pytest.approx(30 / 3600),
        idle_share.id: pytest.approx(30 / 3600),
    }


def test_ingest_counts_a_retried_sample_once(sqlite_url, demo_pool_file):
    upgrade(sqlite_url)
    catalog = default_catalog()
    store = Store(make_engine(sqlite_url), catalog)
    store.load_config(load_pool_config(str(demo_pool_file), catalog))
    lease = store.allocate("alice", "", "h100")
    gpu = lease.slots[0].gpu
    buffer, minutes = UtilizationBuffer(), MinuteAggregator()
    batch = [s(T0, 50.0, gpu=gpu), s(T0 + 30, 50.0, gpu=gpu)]
    busy = per_lease(ingest(store, buffer, batch, 5.0, minutes))
    assert busy == {lease.id: pytest.approx(30 / 3600)}
    assert ingest(store, buffer, batch, 5.0, minutes) == {}  # an agent's retry
    assert minutes.pending[(gpu, -1, M0)].samples == 2
