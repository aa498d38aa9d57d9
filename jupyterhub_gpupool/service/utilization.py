"""Recent utilization samples in memory, per GPU or MIG instance, for live views and busy time.

Node agents post samples; the store keeps the last ``window`` seconds per device. A lease's busy
time (for usage reports and idle decisions) grows by each sample interval in which its device was
at or above ``busy_threshold`` percent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


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
        self.accepted = 0

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
        self.accepted += n
        return n

    def previous(self, gpu: str, start: int | None) -> Sample | None:
        """The newest sample held for a device."""
        ring = self._rings.get((gpu, start))
        return ring[-1] if ring else None

    def series(self, devices: Iterable[tuple[str, int | None]], since: float) -> list[Sample]:
        """Samples of ``devices`` newer than ``since``, by time."""
        out = [s for d in devices for s in self._rings.get(d, ()) if s.ts > since]
        return sorted(out, key=lambda s: (s.ts, s.gpu, s.start or 0))
