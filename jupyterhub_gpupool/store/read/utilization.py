"""A device's stored utilization minute: ``MinuteView``, as the minute aggregates keep it.

The utilization API (``GET allocations/{id}/utilization``), the admin panel's heat map, the
user page's last hour and the reclaimer's record of a reclaimed lease all read these; the
serializer (``service/serialize/utilization.py``) writes the API's JSON (the minute as epoch
seconds, as the samples are).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ... import orm


@dataclass(frozen=True)
class MinuteView:
    """One device's minute: its naive UTC ``minute``, the GPU and MIG ``start`` (None: the
    whole GPU), how many samples it sums, their mean and peak utilization (None where the
    device reports none: MIG without GPM) and the most memory used."""

    minute: datetime
    gpu: str
    start: int | None
    samples: int
    util_mean: float | None
    util_max: float | None
    memory_used_mib_max: int


def minute_view(row: orm.UtilizationMinuteRow) -> MinuteView:
    """The view of a stored minute (a whole GPU's ``start`` is stored as -1)."""
    return MinuteView(
        row.minute,
        row.gpu_uuid,
        None if row.start == -1 else row.start,
        row.samples,
        row.util_mean,
        row.util_max,
        row.memory_used_mib_max,
    )
