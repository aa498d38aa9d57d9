"""What replicas store for each other, on values: a minute whose samples two replicas took (and
flushed in parts) is the minute one replica would have written, and the raw samples the reclaim
rounds read come back as posted, once each, within the window, until pruned."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta

import pytest

from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.idlesignal import GpuSample
from jupyterhub_gpupool.poolconfig import load_pool_config
from jupyterhub_gpupool.service.minutes import MinuteFlusher
from jupyterhub_gpupool.service.telemetry_loop import LocalTelemetry
from jupyterhub_gpupool.service.utilization import (
    MinuteAggregator,
    Sample,
    UtilizationBuffer,
    minute_of,
)
from jupyterhub_gpupool.service.writer import BatchWriter
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.utilization import MinuteView
from jupyterhub_gpupool.store.rows import from_epoch
from jupyterhub_gpupool.store.utilization import window_samples
from jupyterhub_gpupool.telemetry.nvml import NvmlReader
from jupyterhub_gpupool.telemetry.simnvml import SimNvml

T0 = 1_800_000_000.0  # a whole minute (2027-01-15T08:00:00Z)

#: One minute of a whole GPU and of a MIG instance on it (no utilization: MIG without GPM).
SAMPLES = [
    Sample(T0 + 5, "GPU-a", None, 10.0, 100),
    Sample(T0 + 15, "GPU-a", None, 20.0, 900),
    Sample(T0 + 25, "GPU-a", None, None, 300),
    Sample(T0 + 35, "GPU-a", None, 60.0, 200),
    Sample(T0 + 45, "GPU-a", None, 30.0, 400),
    Sample(T0 + 5, "GPU-a", 3, None, 2000, 1),
    Sample(T0 + 15, "GPU-a", 3, None, 2400, 1),
    Sample(T0 + 65, "GPU-a", None, 90.0, 50),  # the next minute
]


def stores(url: str, n: int) -> list[Store]:
    upgrade(url)
    return [Store(make_engine(url), default_catalog()) for _ in range(n)]


def test_a_minute_two_replicas_took_merges_into_the_minute_one_replica_writes(db_url):
    a, b = stores(db_url, 2)
    parts = [MinuteAggregator(), MinuteAggregator()]
    for i, sample in enumerate(SAMPLES):  # posted to A and B in turn
        parts[i % 2].add(sample)
        if i == 2:  # A flushes in the middle of the minute, B later: three partial writes
            a.write_minutes(parts[0].take())
    a.write_minutes(parts[0].take())
    b.write_minutes(parts[1].take())
    since = minute_of(T0) - timedelta(hours=1)
    merged = a.minutes([("GPU-a", None), ("GPU-a", 3)], since)
    assert merged == [
        MinuteView(
            minute=minute_of(T0),
            gpu="GPU-a",
            start=None,
            samples=5,
            util_mean=pytest.approx((10 + 20 + 60 + 30) / 4),  # the null one is not 0 %
            util_max=60.0,
            memory_used_mib_max=900,
        ),
        MinuteView(
            minute=minute_of(T0),
            gpu="GPU-a",
            start=3,
            samples=2,
            util_mean=None,
            util_max=None,
            memory_used_mib_max=2400,
        ),
        MinuteView(
            minute=minute_of(T0 + 60),
            gpu="GPU-a",
            start=None,
            samples=1,
            util_mean=90.0,
            util_max=90.0,
            memory_used_mib_max=50,
        ),
    ]
    # one replica fed every sample (as another GPU, beside them) writes the same values
    single = MinuteAggregator()
    for sample in SAMPLES:
        single.add(replace(sample, gpu="GPU-one"))
    a.write_minutes(single.take())
    one = a.minutes([("GPU-one", None), ("GPU-one", 3)], since)
    assert [replace(m, gpu="GPU-a") for m in one] == merged


def test_raw_samples_come_back_once_each_within_the_window_until_pruned(db_url):
    a, b = stores(db_url, 2)
    shared = Sample(T0 + 10, "GPU-s", None, 70.0, 4000, 2, (("lease-1", 70.0), ("lease-2", 0.0)))
    a.add_busy({}, samples=[*SAMPLES[:4], shared])
    # B took the rest, and a retry of two samples A already stored (the agent's, after a timeout)
    b.add_busy({}, samples=[*SAMPLES[2:], shared])
    devices = [("GPU-a", None), ("GPU-a", 3), ("GPU-s", None), ("GPU-none", None)]
    with b.read() as db:
        got = window_samples(db, devices, T0 + 5, T0 + 45)
    assert got == {
        ("GPU-a", None): [
            GpuSample(T0 + 5, 10.0, 100, None, None),
            GpuSample(T0 + 15, 20.0, 900, None, None),
            GpuSample(T0 + 25, None, 300, None, None),
            GpuSample(T0 + 35, 60.0, 200, None, None),
            GpuSample(T0 + 45, 30.0, 400, None, None),  # both bounds are in the window
        ],
        ("GPU-a", 3): [GpuSample(T0 + 5, None, 2000, 1), GpuSample(T0 + 15, None, 2400, 1)],
        ("GPU-s", None): [GpuSample(T0 + 10, 70.0, 4000, 2, (("lease-1", 70.0), ("lease-2", 0.0)))],
        ("GPU-none", None): [],
    }
    with a.read() as db:  # the other replica reads the same
        assert window_samples(db, devices, T0 + 5, T0 + 45) == got
        assert window_samples(db, [("GPU-a", 3)], T0 + 6, T0 + 14) == {("GPU-a", 3): []}
        assert window_samples(db, [], T0, T0 + 100) == {}
    assert a.prune_samples(T0 + 15) == 3  # strictly older: GPU-a's and the instance's first
    with a.read() as db:
        left = window_samples(db, [("GPU-a", None), ("GPU-a", 3)], 0, T0 + 100)
    assert [s.ts for s in left[("GPU-a", None)]] == [T0 + 15, T0 + 25, T0 + 35, T0 + 45, T0 + 65]
    assert [s.ts for s in left[("GPU-a", 3)]] == [T0 + 15]


def test_the_in_process_loop_stores_its_samples_and_the_flusher_prunes_them(
    sqlite_url, demo_pool_file
):
    """``telemetry_source = sim | nvml`` stores its samples for the rounds as the agents' POSTs
    do; the flusher deletes those past ``utilization_window`` at each flush."""
    upgrade(sqlite_url)
    catalog = default_catalog()
    store = Store(make_engine(sqlite_url), catalog)
    store.load_config(load_pool_config(str(demo_pool_file), catalog))
    now = [T0 + 30]
    machine = SimNvml.from_yaml(demo_pool_file, "sim-h100", clock=lambda: now[0])
    reader = NvmlReader(machine, clock=lambda: now[0])
    writer = BatchWriter(store)
    writer.start()
    loop = LocalTelemetry({"sim-h100": reader}, store, writer, UtilizationBuffer(), None)
    flusher = MinuteFlusher(
        MinuteAggregator(),
        writer.run,
        lambda: from_epoch(T0 + 940),
        interval=60,
        retention_days=30,
        log=logging.getLogger(__name__),
        sample_window=900,
    )

    async def run() -> int:
        assert await loop.check_inventory("sim-h100")
        for t in (T0 + 30, T0 + 45):
            now[0] = t
            await loop.collect("sim-h100")
        return await flusher.prune_samples()  # older than T0 + 940 - 900

    try:
        pruned = asyncio.run(run())
    finally:
        writer.stop()
    nodes = [n for c in store.pool(detail=True).clusters or () for n in c.nodes]
    gpus = sorted(g.uuid for n in nodes if n.name == "sim-h100" for g in n.gpus)
    assert len(gpus) == 2 and pruned == 2
    with store.read() as db:
        left = window_samples(db, [(g, None) for g in gpus], 0, T0 + 100)
    assert {g: [s.ts for s in left[(g, None)]] for g in gpus} == {g: [T0 + 45] for g in gpus}
    assert all(s.util is not None for g in gpus for s in left[(g, None)])
