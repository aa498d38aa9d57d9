"""The fair queue: who is served first when capacity frees.

Order: priority class, then requests within guarantee before borrowing ones, then the
lowest weighted share of the group (held / guarantee), then arrival. Aging lifts a waiter one
priority level per ``aging_interval`` seconds waited, so nobody starves behind a busy class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from .model import Request


@dataclass
class Waiter:
    """A queued request and what the queue orders it by."""

    request: Request
    units: Fraction
    group: str | None
    within_guarantee: bool
    reason: str
    since: float
    #: The node held for it while it waits long (``pool.headroom.kept_hold``: kept until it
    #: is granted, gone, or can no longer be served there); None: none remembered.
    hold: str | None = field(default=None, compare=False)

    def effective_priority(self, now: float, aging_interval: float) -> int:
        """Priority plus one level per ``aging_interval`` waited (no aging when it is 0)."""
        if aging_interval <= 0:
            return self.request.priority
        return self.request.priority + math.floor(max(0.0, now - self.since) / aging_interval)


def order_key(
    waiter: Waiter, now: float, share: Callable[[Waiter], float], aging_interval: float
) -> tuple[int, bool, float, float, str]:
    """Sort key; smaller is served first."""
    return (
        -waiter.effective_priority(now, aging_interval),
        not waiter.within_guarantee,
        share(waiter),
        waiter.since,
        waiter.request.id,
    )


def ordered(
    waiters: Iterable[Waiter],
    now: float,
    share: Callable[[Waiter], float],
    aging_interval: float = 600.0,
) -> list[Waiter]:
    """Waiters in service order."""
    return sorted(waiters, key=lambda w: order_key(w, now, share, aging_interval))


def estimate_wait(position: int, releases_per_hour: float) -> float | None:
    """Seconds until a waiter at ``position`` (1-based) is likely served, from the release rate.

    ``None`` when nothing has been released lately: any number would be a guess.
    """
    if releases_per_hour <= 0:
        return None
    return position * 3600.0 / releases_per_hour
