"""A stored utilization minute's JSON (the ``minutes`` of ``GET allocations/{id}/utilization``
and ``GET utilization``): the minute as epoch seconds, like the live samples beside it."""

from __future__ import annotations

from typing import Any

from ...store.read.utilization import MinuteView
from ...store.rows import epoch

__all__ = ["minute_json"]


def minute_json(view: MinuteView) -> dict[str, Any]:
    """``ts`` (epoch seconds), ``gpu``, ``start``, ``samples``, ``util_mean``, ``util_max``
    and ``memory_used_mib_max``."""
    return {
        "ts": epoch(view.minute),
        "gpu": view.gpu,
        "start": view.start,
        "samples": view.samples,
        "util_mean": view.util_mean,
        "util_max": view.util_max,
        "memory_used_mib_max": view.memory_used_mib_max,
    }
