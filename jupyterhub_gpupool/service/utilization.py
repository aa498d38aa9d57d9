"""Utilization samples: full rate in memory for live views, one-minute aggregates in the database.

Node agents (or the in-process telemetry loop) feed samples; the buffer keeps the last
``window`` seconds per device. Each new sample is also folded into its device's minute, and the
minutes are flushed to ``utilization_minutes`` for history, reports and idle decisions, kept
for a configurable number of days. A lease's busy time grows by each sample interval in which
its device was at or above ``busy_threshold`` percent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from .. import orm


@dataclass(frozen=True)
class Sample:
    """One reading of one device (a GPU, or a MIG instance at ``start`` on it)."""

    ts: float
    gpu: str
    start: int | None
    util: float | None
    memory_used_mib: int

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {
            "ts": self.ts,
            "gpu": self.gpu,
            "start": self.start,
            "util": self.util,
            "memory_used_mib": self.memory_used_mib,
        }


class UtilizationBuffer:
    """A bounded ring of samples per device: memory stays flat however long it runs."""

    def __init__(self, window: float = 900.0, max_per_device: int = 2000) -> None:
        self.window = window
        self.max_per_device = max_per_device
        self._rings: dict[tuple[str, int | None], deque[Sample]] = {}

    def add(self, samples: Iterable[Sample]) -> int:
        """Store samples (oldest beyond the window are dropped); returns how many were new."""
        n = 0
        for s in samples:
            ring = self._rings.setdefault((s.gpu, s.start), deque(maxlen=self.max_per_device))
            if ring and s.ts <= ring[-1].ts:
                continue  # duplicate or out of order (agent retry): keep the first
            ring.append(s)
            while ring and ring[0].ts < s.ts - self.window:
                ring.popleft()
            n += 1
        return n

    def previous(self, gpu: str, start: int | None) -> Sample | None:
        """The newest sample held for a device."""
        ring = self._rings.get((gpu, start))
        return ring[-1] if ring else None

    def series(self, devices: Iterable[tuple[str, int | None]], since: float) -> list[Sample]:
        """Samples of ``devices`` newer than ``since``, by time."""
        out = [s for d in devices for s in self._rings.get(d, ()) if s.ts > since]
        return sorted(out, key=lambda s: (s.ts, s.gpu, s.start or 0))


# --- one-minute aggregates (history) -----------------------------------------------------------

#: A device's minute: (GPU uuid, MIG start or -1 for the whole GPU, naive UTC minute).
MinuteKey = tuple[str, int, datetime]


def minute_of(ts: float) -> datetime:
    """The naive UTC minute an epoch timestamp falls in."""
    return datetime.fromtimestamp(ts - ts % 60, timezone.utc).replace(tzinfo=None)


def epoch(dt: datetime) -> float:
    """Epoch seconds of a naive UTC datetime."""
    return dt.replace(tzinfo=timezone.utc).timestamp()


@dataclass
class MinuteStats:
    """What a minute of samples of one device sums up to (mergeable, so partial flushes add)."""

    samples: int = 0
    util_samples: int = 0
    util_sum: float = 0.0
    util_max: float | None = None
    memory_used_mib_max: int = 0

    def add(self, s: Sample) -> None:
        """Count one sample."""
        self.samples += 1
        if s.util is not None:
            self.util_samples += 1
            self.util_sum += s.util
            self.util_max = s.util if self.util_max is None else max(self.util_max, s.util)
        self.memory_used_mib_max = max(self.memory_used_mib_max, s.memory_used_mib)

    def merge(self, other: MinuteStats) -> None:
        """Fold another partial minute of the same device in."""
        self.samples += other.samples
        self.util_samples += other.util_samples
        self.util_sum += other.util_sum
        if other.util_max is not None:
            self.util_max = (
                other.util_max if self.util_max is None else max(self.util_max, other.util_max)
            )
        self.memory_used_mib_max = max(self.memory_used_mib_max, other.memory_used_mib_max)

    @property
    def util_mean(self) -> float | None:
        """Mean utilization of the samples that had one (None when none had)."""
        return self.util_sum / self.util_samples if self.util_samples else None


class MinuteAggregator:
    """Samples folded per (device, minute) in memory until the next flush to the database.

    A flush takes everything, the open minute included: the database row of a minute merges
    later parts (``write_minutes`` upserts), so a flush never has to wait for a minute to end.
    """

    def __init__(self) -> None:
        self.pending: dict[MinuteKey, MinuteStats] = {}

    def add(self, sample: Sample) -> None:
        """Count a (new, deduplicated) sample in its device's minute."""
        key = (sample.gpu, -1 if sample.start is None else sample.start, minute_of(sample.ts))
        self.pending.setdefault(key, MinuteStats()).add(sample)

    def take(self) -> dict[MinuteKey, MinuteStats]:
        """Everything accumulated since the last take."""
        taken, self.pending = self.pending, {}
        return taken

    def restore(self, taken: Mapping[MinuteKey, MinuteStats]) -> None:
        """Put back what a failed flush took (merged with what came meanwhile)."""
        for key, stats in taken.items():
            self.pending.setdefault(key, MinuteStats()).merge(stats)


def write_minutes(
    session_factory: Callable[[], Session], minutes: Mapping[MinuteKey, MinuteStats]
) -> int:
    """Upsert minutes into ``utilization_minutes`` in one short transaction (no pool lock).

    A minute already stored (an earlier partial flush, a late agent backlog) is merged: counts
    add, the mean is weighted by the samples that had a utilization, maxima stay maxima.
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
    with session_factory() as db, db.begin():
        if db.get_bind().dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        t = orm.UtilizationMinuteRow.__table__.c
        for i in range(0, len(rows), 100):  # well under SQLite's bound-parameter limit
            stmt = insert(orm.UtilizationMinuteRow).values(rows[i : i + 100])
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
                        (new.memory_used_mib_max > t.memory_used_mib_max, new.memory_used_mib_max),
                        else_=t.memory_used_mib_max,
                    ),
                },
            )
            db.execute(stmt)
    return len(rows)


def prune_minutes(session_factory: Callable[[], Session], before: datetime) -> int:
    """Delete minutes older than ``before`` (the retention limit); returns how many."""
    with session_factory() as db, db.begin():
        result = db.execute(
            delete(orm.UtilizationMinuteRow).where(orm.UtilizationMinuteRow.minute < before)
        )
        return result.rowcount or 0


def read_minutes(
    db: Session,
    devices: Iterable[tuple[str, int | None]] | None,
    since: datetime,
    until: datetime | None = None,
) -> list[dict[str, object]]:
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
