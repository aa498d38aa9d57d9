"""The headroom as admins look at it (``pool.headroom``): per GPU model the free units it
counts against ``keep_free`` and what is missing, and which node is held for which long
waiter (``Allocator.holds``, the sticky hold), with whether that node's free units are out of
the count (its waiter outranks every class never preempted). The pool map's ``headroom``
(``GET pool/map``) and the metrics' ``gpupool_headroom_*`` gauges read it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ...pool.allocator import Allocator
from ...pool.headroom import deficits
from ..rows import epoch, from_epoch

__all__ = ["HeadroomView", "HeldNodeView", "ModelRoomView", "headroom_view"]


@dataclass(frozen=True)
class ModelRoomView:
    """One GPU model: ``keep_free`` GPUs kept from borrowing (0: none), ``free_units`` the
    headroom's count (free units of schedulable hardware, less those of the held nodes out of
    the count) and ``short_units`` what the refill still has to free (0: none)."""

    model: str
    keep_free: int
    free_units: float
    short_units: float


@dataclass(frozen=True)
class HeldNodeView:
    """A node held for a long waiter: the waiter's request (its lease id), user and offer,
    since when it waits, and whether the node's free units are ``out_of_count`` (the waiter
    aged past every class never preempted: only it may use them)."""

    node: str
    request: str
    user: str
    offer: str
    waiting_since: datetime
    out_of_count: bool


@dataclass(frozen=True)
class HeadroomView:
    """``keep_free``: the pool config's ``borrowing`` as it reads (``keep_free 2``, ``none``);
    ``models`` in name order; ``held`` in queue order."""

    keep_free: str
    models: tuple[ModelRoomView, ...]
    held: tuple[HeldNodeView, ...]


def headroom_view(alloc: Allocator, now: datetime) -> HeadroomView:
    """The headroom of ``alloc`` at ``now`` (naive UTC, the store's clock)."""
    t = epoch(now)
    h = alloc.headroom
    holds = alloc.holds(t)
    free, out = alloc.headroom_free(t)
    short = deficits(h, free, {}) if h is not None else {}
    models = tuple(
        ModelRoomView(
            model,
            h.keep(model) if h is not None else 0,
            round(free[model], 6),
            round(short.get(model, 0.0), 6),
        )
        for model in sorted(free)
    )
    held = tuple(
        HeldNodeView(
            node,
            rid,
            alloc.waiters[rid].request.user,
            alloc.waiters[rid].request.offer,
            from_epoch(alloc.waiters[rid].since),
            node in out,
        )
        for rid, node in holds.items()
    )
    return HeadroomView(h.describe() if h is not None else "none", models, held)
