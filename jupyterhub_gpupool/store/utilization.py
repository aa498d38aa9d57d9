"""Utilization history in the database: one-minute aggregates per device, written in short
transactions of their own (no pool lock: no decision reads them), pruned past retention."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypedDict, cast

from sqlalchemy import CursorResult, case, delete, func, select

from .. import orm
from .core import StoreCore
from .rows import epoch, upsert_insert

#: A device's minute: (GPU uuid, MIG start or -1 for the whole GPU, naive UTC minute).
MinuteKey = tuple[str, int, datetime]


class Minute(TypedDict):
    """One stored utilization minute of a device, JSON-ready (``minutes``)."""

    ts: float
    gpu: str
    start: int | None
    samples: int
    util_mean: float | None
    util_max: float | None
    memory_used_mib_max: int


class MinuteTotals(Protocol):
    """What a minute of one device's samples sums up to (``service.utilization.MinuteStats``)."""

    samples: int
    util_samples: int
    util_max: float | None
    memory_used_mib_max: int

    @property
    def util_mean(self) -> float | None: ...


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

    def minutes(
        self,
        devices: Iterable[tuple[str, int | None]] | None,
        since: datetime,
        until: datetime | None = None,
    ) -> list[Minute]:
        """Stored minutes from ``since`` (to ``until``) of ``devices`` (None: all), JSON-ready."""
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
                {
                    "ts": epoch(r.minute),
                    "gpu": r.gpu_uuid,
                    "start": None if r.start == -1 else r.start,
                    "samples": r.samples,
                    "util_mean": r.util_mean,
                    "util_max": r.util_max,
                    "memory_used_mib_max": r.memory_used_mib_max,
                }
                for r in db.scalars(query)
                if wanted is None or (r.gpu_uuid, r.start) in wanted
            ]
