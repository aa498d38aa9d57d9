"""Utilization in the database: one-minute aggregates per device (history, in short
transactions of their own, no pool lock: no decision reads them), pruned past retention; and
the raw samples of the last window, which the reclaim round reads (so every replica decides on
every replica's samples).

Why raw samples and not wider minutes: the idle rules read each sample of the window (its
time against the window's bounds and the staleness bound, utilization, memory in use and its
change, processes, per-lease utilization on shares), and a reclaimer's window starts and ends
anywhere in a minute; only the samples themselves decide as the in-memory window did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import CursorResult, Table, case, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .. import orm
from ..pool.idlesignal import GpuSample
from .core import StoreCore
from .read.devices import GpuHoldersView, GpuNodesView, gpu_holders_view, gpu_nodes_view
from .read.utilization import MinuteView, minute_view
from .rows import upsert_insert

#: A device's minute: (GPU uuid, MIG start or -1 for the whole GPU, naive UTC minute).
MinuteKey = tuple[str, int, datetime]
#: A device as samples and leases name it: (GPU uuid, MIG start or None for the whole GPU).
Device = tuple[str, int | None]


class MinuteTotals(Protocol):
    """What a minute of one device's samples sums up to (``service.utilization.MinuteStats``)."""

    samples: int
    util_samples: int
    util_max: float | None
    memory_used_mib_max: int

    @property
    def util_mean(self) -> float | None: ...


class SampleFields(Protocol):
    """One raw sample of one device, as stored (``service.utilization.Sample``)."""

    @property
    def ts(self) -> float: ...
    @property
    def gpu(self) -> str: ...
    @property
    def start(self) -> int | None: ...
    @property
    def util(self) -> float | None: ...
    @property
    def memory_used_mib(self) -> int: ...
    @property
    def processes(self) -> int | None: ...
    @property
    def lease_util(self) -> tuple[tuple[str, float], ...] | None: ...


def put_samples(db: Session, samples: Sequence[SampleFields]) -> None:
    """Insert raw samples in the caller's transaction; one already stored (the same device and
    time, posted again to this or another replica) is kept as it was."""
    if not samples:
        return
    rows = [
        {
            "gpu_uuid": s.gpu,
            "start": -1 if s.start is None else s.start,
            "ts": s.ts,
            "util": s.util,
            "memory_used_mib": s.memory_used_mib,
            "processes": s.processes,
            "lease_util": None if s.lease_util is None else [list(p) for p in s.lease_util],
        }
        for s in samples
    ]
    table = cast(Table, orm.UtilizationSampleRow.__table__)  # a mapped class's is a Table
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    # the table's INSERT, run as one executemany on the session's connection (the ORM's bulk
    # path costs twice as much per row, a multi-row VALUES more still to compile)
    db.connection().execute(dialect.insert(table).on_conflict_do_nothing(), rows)


def window_samples(
    db: Session, devices: Iterable[Device], start: float, end: float
) -> dict[Device, list[GpuSample]]:
    """The stored samples of ``devices`` from ``start`` to ``end`` (both included), by time:
    every replica's, so a decision does not depend on which replica took a sample."""
    wanted = {(g, -1 if s is None else s) for g, s in devices}
    out: dict[Device, list[GpuSample]] = {(g, None if s == -1 else s): [] for g, s in wanted}
    if not wanted:
        return out
    T = orm.UtilizationSampleRow
    query = (
        select(T.gpu_uuid, T.start, T.ts, T.util, T.memory_used_mib, T.processes, T.lease_util)
        .where(T.gpu_uuid.in_(sorted({g for g, _ in wanted})), T.ts >= start, T.ts <= end)
        .order_by(T.ts, T.gpu_uuid, T.start)
    )
    for gpu, mig, ts, util, memory, processes, lease_util in db.execute(query):
        if (gpu, mig) not in wanted:
            continue
        pairs = None if lease_util is None else tuple((str(k), float(v)) for k, v in lease_util)
        out[(gpu, None if mig == -1 else mig)].append(GpuSample(ts, util, memory, processes, pairs))
    return out


class UtilizationStore(StoreCore):
    """Minute aggregates: written by the service's flusher, read by the utilization API."""

    def write_minutes(self, minutes: Mapping[MinuteKey, MinuteTotals]) -> int:
        """Upsert minutes into ``utilization_minutes`` in one short transaction.

        A minute already stored (an earlier partial flush, a late agent backlog) is merged:
        counts add, the mean is weighted by the samples that had a utilization, maxima stay
        maxima.
        """
        if not minutes:
            return 0
        rows = [
            {
                "gpu_uuid": gpu,
                "start": start,
                "minute": minute,
                "samples": s.samples,
                "util_samples": s.util_samples,
                "util_mean": s.util_mean,
                "util_max": s.util_max,
                "memory_used_mib_max": s.memory_used_mib_max,
            }
            for (gpu, start, minute), s in sorted(minutes.items())
        ]
        with self.writing() as db:
            t = orm.UtilizationMinuteRow.__table__.c
            for i in range(0, len(rows), 100):  # well under SQLite's bound-parameter limit
                stmt = upsert_insert(db, orm.UtilizationMinuteRow).values(rows[i : i + 100])
                new = stmt.excluded
                n = t.util_samples + new.util_samples
                weighted = (
                    func.coalesce(t.util_mean, 0.0) * t.util_samples
                    + func.coalesce(new.util_mean, 0.0) * new.util_samples
                )
                stmt = stmt.on_conflict_do_update(
                    index_elements=[t.gpu_uuid, t.start, t.minute],
                    set_={
                        "samples": t.samples + new.samples,
                        "util_samples": n,
                        "util_mean": case((n == 0, None), else_=weighted / n),
                        "util_max": case(
                            (t.util_max.is_(None), new.util_max),
                            (new.util_max.is_(None), t.util_max),
                            (new.util_max > t.util_max, new.util_max),
                            else_=t.util_max,
                        ),
                        "memory_used_mib_max": case(
                            (
                                new.memory_used_mib_max > t.memory_used_mib_max,
                                new.memory_used_mib_max,
                            ),
                            else_=t.memory_used_mib_max,
                        ),
                    },
                )
                db.execute(stmt)
        return len(rows)

    def prune_minutes(self, before: datetime) -> int:
        """Delete minutes older than ``before`` (the retention limit); returns how many."""
        with self.writing() as db:
            # a DELETE's result is a cursor's (Session.execute types it as any Result)
            result = cast(
                CursorResult[Any],
                db.execute(
                    delete(orm.UtilizationMinuteRow).where(orm.UtilizationMinuteRow.minute < before)
                ),
            )
            return result.rowcount or 0

    def prune_samples(self, before: float) -> int:
        """Delete raw samples older than ``before`` (epoch seconds: the decisions' window is
        past them); returns how many."""
        with self.writing() as db:
            T = orm.UtilizationSampleRow
            result = cast(CursorResult[Any], db.execute(delete(T).where(T.ts < before)))
            return result.rowcount or 0

    def devices(self) -> list[Device]:
        """Every device of the pool as samples name it: each GPU whole, then each MIG
        instance (what an admin's utilization without a lease covers)."""
        with self.locked() as alloc:
            out: list[Device] = [(g, None) for g in alloc.gpus]
            out += [(g.uuid, i.start) for g in alloc.gpus.values() for i in g.instances]
        return out

    def gpu_nodes(self, uuids: Iterable[str], *, fresh: bool = False) -> GpuNodesView:
        """The GPUs of ``uuids`` the pool knows, with their node (``read.devices``): what an
        agent's batch of samples is checked against. ``fresh=False``: it may be ``view_lag``
        behind (``locked``); the caller asks again with ``fresh=True`` for a GPU not known
        yet (its inventory may have just been committed by the store process)."""
        with self.locked(fresh=fresh) as alloc:
            return gpu_nodes_view(alloc, uuids)

    def gpu_holders(self, uuids: Iterable[str], *, fresh: bool = False) -> GpuHoldersView:
        """Who holds the GPUs of ``uuids`` (``read.devices``): whose busy time a batch of
        samples counts. One locked call, so the holders are one consistent state (no decision
        changes them between two of its GPUs: sample ingestion held the allocator across its
        loop for that before). ``fresh=False``: sample ingestion may be
        ``view_lag`` behind rather than rebuild the allocator for every batch (``locked``)."""
        with self.locked(fresh=fresh) as alloc:
            return gpu_holders_view(alloc, uuids)

    def latest_sample_times(
        self, devices: Iterable[tuple[str, int | None]]
    ) -> dict[tuple[str, int | None], float]:
        """The newest stored raw sample's time of each of ``devices`` that has one: where
        another replica's samples of a device end, so busy time is counted from there (and a
        sample already stored through another replica is not counted twice)."""
        wanted = {(g, -1 if s is None else s) for g, s in devices}
        if not wanted:
            return {}
        T = orm.UtilizationSampleRow
        query = (
            select(T.gpu_uuid, T.start, func.max(T.ts))
            .where(T.gpu_uuid.in_(sorted({g for g, _ in wanted})))
            .group_by(T.gpu_uuid, T.start)
        )
        with self.read() as db:
            return {
                (gpu, None if start == -1 else start): float(ts)
                for gpu, start, ts in db.execute(query)
                if (gpu, start) in wanted and ts is not None
            }

    def minutes(
        self,
        devices: Iterable[tuple[str, int | None]] | None,
        since: datetime,
        until: datetime | None = None,
    ) -> list[MinuteView]:
        """Stored minutes from ``since`` (to ``until``) of ``devices`` (None: all), oldest
        first."""
        T = orm.UtilizationMinuteRow
        query = select(T).where(T.minute >= since).order_by(T.minute, T.gpu_uuid, T.start)
        if until is not None:
            query = query.where(T.minute <= until)
        wanted = None
        if devices is not None:
            wanted = {(g, -1 if s is None else s) for g, s in devices}
            if not wanted:
                return []
            query = query.where(T.gpu_uuid.in_(sorted({g for g, _ in wanted})))
        with self.read() as db:
            return [
                minute_view(r)
                for r in db.scalars(query)
                if wanted is None or (r.gpu_uuid, r.start) in wanted
            ]
