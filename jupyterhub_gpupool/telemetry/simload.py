"""Load patterns of the simulated NVML: utilization over time per GPU or MIG instance
(``idle``, ``steady``, ``bursty``, ``notebook``), deterministic for a seed and a clock."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ..pool.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Load patterns

PATTERNS = ("idle", "steady", "bursty", "notebook")
_PATTERN_KEYS = {"pattern", "level", "memory", "period", "duty", "train", "delay", "jitter"}


@dataclass(frozen=True)
class LoadPattern:
    """How busy a GPU or MIG instance is over time, deterministic for a seed and a key.

    ``steady``: ``level`` % all the time. ``bursty``: ``level`` % for ``duty`` of every
    ``period`` seconds, near 0 otherwise. ``notebook``: trains at ``level`` % for ``train``
    seconds (after ``delay``), then sits idle while still holding its memory. ``memory`` is the
    share of the device's memory in use while the workload exists.
    """

    pattern: str = "idle"
    level: float = 60.0
    memory: float = 0.5
    period: float = 300.0
    duty: float = 0.3
    train: float = 1800.0
    delay: float = 0.0
    jitter: float = 3.0

    def util(self, t: float, seed: int, key: str) -> float:
        """Activity percentage at ``t`` seconds after the simulation started."""
        noise = _noise(seed, key, t) * self.jitter
        if self.pattern == "steady":
            value = self.level + noise
        elif self.pattern == "bursty":
            offset = (zlib.crc32(f"{seed}:{key}".encode()) % 1000) / 1000 * self.period
            on = (t + offset) % self.period < self.duty * self.period
            value = self.level + noise if on else 2.0 + noise / 3
        elif self.pattern == "notebook":
            elapsed = t - self.delay
            value = self.level + noise if 0 <= elapsed < self.train else 0.0
        else:
            value = 0.0
        return min(100.0, max(0.0, value))

    def memory_share(self, t: float) -> float:
        """Share of the device's memory the workload holds at ``t``."""
        if self.pattern == "idle" or (self.pattern == "notebook" and t < self.delay):
            return 0.0
        return min(1.0, max(0.0, self.memory))


def _noise(seed: int, key: str, t: float) -> float:
    """Deterministic noise in [-1, 1], constant within each simulated second."""
    h = zlib.crc32(f"{seed}|{key}|{int(t // 1)}".encode())
    return (h % 20001) / 10000.0 - 1.0


def parse_load(raw: object, where: str) -> LoadPattern:
    """A load pattern from ``idle`` or ``{pattern: steady, level: 70, ...}``."""
    if isinstance(raw, str):
        raw = {"pattern": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a pattern name or a mapping", field=where)
    unknown = set(raw) - _PATTERN_KEYS
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
            field=where,
            allowed=sorted(_PATTERN_KEYS),
        )
    pattern = raw.get("pattern", "idle")
    if pattern not in PATTERNS:
        raise ConfigError(
            f"unknown load pattern {pattern!r}", field=f"{where}.pattern", allowed=list(PATTERNS)
        )
    kwargs: dict[str, float] = {}
    for key in _PATTERN_KEYS - {"pattern"}:
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"must be a number ≥ 0, got {value!r}", field=f"{where}.{key}")
            kwargs[key] = float(value)
    if kwargs.get("level", 0) > 100 or kwargs.get("memory", 0) > 1 or kwargs.get("duty", 0) > 1:
        raise ConfigError("level is 0–100, memory and duty are 0–1", field=where)
    if "period" in kwargs and kwargs["period"] <= 0:
        raise ConfigError("must be > 0", field=f"{where}.period")
    return LoadPattern(pattern=pattern, **kwargs)


def _parse_gpu_load(raw: object, where: str) -> tuple[LoadPattern, dict[int, LoadPattern]]:
    """A GPU's ``load``: its own pattern plus ``instances: {start: pattern}`` for MIG."""
    if raw is None:
        return LoadPattern(), {}
    per_instance: dict[int, LoadPattern] = {}
    if isinstance(raw, Mapping) and "instances" in raw:
        raw = dict(raw)
        inst = raw.pop("instances") or {}
        if not isinstance(inst, Mapping):
            raise ConfigError("must map MIG starts to patterns", field=f"{where}.instances")
        for start, pat in inst.items():
            try:
                s = int(start)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{start!r} is not a memory-slice start", field=f"{where}.instances"
                ) from None
            per_instance[s] = parse_load(pat, f"{where}.instances.{start}")
    return parse_load(raw if raw else "idle", where), per_instance
