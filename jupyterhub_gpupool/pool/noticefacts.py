"""What the reclaim and notice rules (``pool.rules.reclaim``) read of a lease's row beyond its
``LeaseFacts``: its reclaim state, its notice's columns as written and its claim."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from .reclaim import ReclaimState

if TYPE_CHECKING:  # facts.py's PoolState names these: it imports this module
    from .facts import LeaseFacts


@dataclass(frozen=True)
class Noticed:
    """A lease as the notice rules read it: its facts, its reclaim state (notice included),
    its notice's columns (``action``, ``reason``, and ``deadline``, an aware UTC ``datetime``;
    None where none is) and when its action was claimed (``acting``, epoch seconds, and
    ``since``, the same moment as an aware UTC ``datetime``; None: not claimed)."""

    lease: LeaseFacts
    reclaim: ReclaimState = field(default_factory=ReclaimState)
    action: str | None = None
    reason: str | None = None
    deadline: datetime | None = None
    acting: float | None = None
    since: datetime | None = None


@dataclass(frozen=True)
class Shrinkable:
    """What a round's shrink of a lease reads to reserve its target (``commands.Resize``):
    the id the target would get, and the live target the lease already has, if any."""

    new_id: str
    pending: str | None = None
