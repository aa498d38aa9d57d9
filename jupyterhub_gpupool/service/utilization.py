"""Utilization samples: full rate in memory for live views, one-minute aggregates in the database.

Node agents (or the in-process telemetry loop) feed samples; the buffer keeps the last
``window`` seconds per device. Each new sample is also folded into its device's minute, and the
minutes are flushed (``Store.write_minutes``, through the writer) to ``utilization_minutes``
for history and reports, kept for a configurable number of days. Idle decisions read neither:
the samples are also stored raw (``AddBusy``'s ``samples``, ``utilization_samples``) for the
reclaim rounds, so every replica decides on every replica's samples. A lease's busy time grows
by each sample interval in which its device was at or above ``busy_threshold`` percent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..store.rows import epoch as epoch
from ..store.utilization import MinuteKey


@dataclass(frozen=True)
class Sample:
    """One reading of one device (a GPU, or a MIG instance at ``start`` on it)."""

    ts: float
    gpu: str
    start: int | None
    util: float | None
    memory_used_mib: int
    #: compute processes on the device (MIG instances; None where NVML did not say)
    processes: int | None = None
    #: utilization by lease from per-process samples (GPUs not in MIG mode; None: unknown).
    #: Kept for the reclaimer's share signal; never shown (it names other users' leases).
    lease_util: tuple[tuple[str, float], ...] | None = None

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {
            "ts": self.ts,
            "gpu": self.gpu,
            "start": self.start,
            "util": self.util,
            "memory_used_mib": self.memory_used_mib,
            "processes": self.processes,
        }


def lease_util_pairs(raw: object) -> tuple[tuple[str, float], ...] | None:
    """A reader's ``lease_util`` mapping as sorted ``(lease, %)`` pairs (``None`` stays None)."""
    if not isinstance(raw, dict):
        return None
    return tuple(sorted((str(k), float(v)) for k, v in raw.items()))


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

    def latest(self, since: float) -> Iterator[tuple[tuple[str, int | None], Sample]]:
        """Each device's newest sample, for those that have one newer than ``since``."""
        for device, ring in self._rings.items():
            if ring and ring[-1].ts > since:
                yield device, ring[-1]

    def series(self, devices: Iterable[tuple[str, int | None]], since: float) -> list[Sample]:
        """Samples of ``devices`` newer than ``since``, by time."""
        out = [s for d in devices for s in self._rings.get(d, ()) if s.ts > since]
        return sorted(out, key=lambda s: (s.ts, s.gpu, s.start or 0))


# --- one-minute aggregates (history) -----------------------------------------------------------


def minute_of(ts: float) -> datetime:
    """The naive UTC minute an epoch timestamp falls in."""
    return datetime.fromtimestamp(ts - ts % 60, timezone.utc).replace(tzinfo=None)


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
