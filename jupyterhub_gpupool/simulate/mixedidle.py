"""Notebook idle reclaim in the mixed-pool replay (``simulate.mixed``): the reclaimer's own rules.

Every 30 s window, each running notebook lease of a class the reclaimer watches
(``workloads.idle_reclaimable``: notebooks, not training or inference) is read as the reclaimer
reads it and decided by ``pool.reclaim.plan_reclaims`` with the pool's default reclaim policy
(``pool.reclaimpolicy.ReclaimPolicy``: idle 30 min, 20 min when a waiter wants that hardware,
notice 10 min ahead, ...) against the allocator's own queue and quotas, as
``store/reclaim.py``'s round does.

What a session does comes from its generated segments (``simulate.sessions``), moved later by
every wait for a GPU so far (the user does what they planned once they have one): the GPU's
utilization (70 % while a segment computes, else 0 %), the kernels (``unknown`` for the
servers that refuse the reclaimer's token; their ``last_activity`` the end of the last window
they were busy in), the user's last input as the lab reports it (counted for
``LAB_REPORT_LAG`` after it, as ``store/reclaim.py`` reads it) and the open tab. No telemetry
outages (``simulate.reclaim`` measures those) and no keepalives. A segment without
input that began before the server did (120 s of spawning) reads as idle: a kernel the reclaim
stopped does not go on by itself. A reclaimed user comes back at their next segment with input
and asks again; that wait counts among the notebook waits like the first.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..pool.allocator import Allocator
from ..pool.idlesignal import LAB_REPORT_LAG
from ..pool.model import Offer
from ..pool.reclaim import (
    Act,
    Cancel,
    GpuSample,
    KernelView,
    LeaseInfo,
    Notice,
    PresenceView,
    ReclaimState,
    Signals,
    parse_policies,
    plan_reclaims,
)
from .reclaim import AWAY, Activity
from .sessions import DAY, Session

WINDOW = 30.0
#: The lease's model, as the pool records it (whole H100s only in this replay).
MODEL = "H100-80GB"
BUSY_UTIL = 70.0


@dataclass
class NotebookLife:
    """One notebook session's life in the replay: how late it runs, its reclaim state."""

    session: Session
    starts: list[float] = field(default_factory=list)
    #: seconds the session runs later than planned: its waits for a GPU so far
    offset: float = 0.0
    live_from: float = 0.0
    state: ReclaimState = field(default_factory=ReclaimState)
    parked: bool = False
    last_input: float | None = None
    kernel_active: float | None = None

    def __post_init__(self) -> None:
        self.starts = [g.start for g in self.session.segments]

    @property
    def planned_end(self) -> float:
        """When the user stops the server (midnight if they never do), moved by the waits."""
        return (self.session.end if self.session.stop else DAY) + self.offset

    def activity(self, t: float) -> Activity:
        """What the session does in the window ending at ``t``."""
        mid = t - WINDOW / 2 - self.offset
        i = bisect.bisect_right(self.starts, mid) - 1
        if i < 0:
            return AWAY
        seg = self.session.segments[i]
        if mid >= seg.end:
            return AWAY
        if not seg.input and seg.start + self.offset < self.live_from - 120:
            return Activity(False, "idle", False, seg.tab)
        return Activity(seg.gpu, seg.kernel, seg.input, seg.tab)

    def next_return(self, t: float) -> float | None:
        """When a reclaimed user comes back: their next segment with input from ``t``."""
        for seg in self.session.segments:
            if seg.input and seg.start + self.offset >= t:
                return seg.start + self.offset
        return None


def signals(life: NotebookLife, t: float) -> Signals:
    """The window ``[t - WINDOW, t]`` as the reclaimer reads a whole GPU: one utilization
    sample, the kernels, the lab's last input and open tabs (and keep the last two)."""
    act = life.activity(t)
    if act.input:
        life.last_input = t - 1
    if act.kernel == "busy":
        life.kernel_active = t
    kernel = (
        KernelView(t, act.kernel, life.kernel_active)
        if life.session.kernel_visible
        else KernelView(t, "unknown")
    )
    return Signals(
        t - WINDOW,
        t,
        "utilization",
        (GpuSample(t, BUSY_UTIL if act.gpu else 0.0),),
        kernel,
        PresenceView(t, life.last_input, int(act.tab), lag=LAB_REPORT_LAG),
    )


@dataclass
class Outcome:
    """One window's decisions: the leases given notice, cancelled, and to stop now."""

    notices: int = 0
    cancelled: int = 0
    stop: list[str] = field(default_factory=list)


class IdleReclaim:
    """The reclaimer's round over one allocator's notebook leases, with the default policy."""

    def __init__(self, offers: Mapping[str, Offer]) -> None:
        self.offers = offers
        self.policies = parse_policies(None, offers)

    def round(
        self, alloc: Allocator, live: Sequence[tuple[str, NotebookLife]], t: float
    ) -> Outcome:
        """Decide the window ending at ``t`` for ``live`` (lease id, its session's life) and
        keep each decision's state; returns what to carry out."""
        out = Outcome()
        if not live:
            return out
        held = [(alloc.leases[lid], life) for lid, life in live]
        leases = [
            LeaseInfo(
                lease.id,
                life.session.user,
                lease.offer,
                lease.units,
                life.live_from,
                borrowed=lease.borrowed,
                models=(MODEL,),
                state=life.state,
            )
            for lease, life in held
        ]
        sigs = {lid: signals(life, t) for lid, life in live}
        decisions = plan_reclaims(
            leases, sigs, self.policies, alloc.queue(t), alloc.quotas, t, offers=self.offers
        )
        for (lid, life), d in zip(live, decisions, strict=True):
            life.state = d.state
            if isinstance(d, Notice):
                out.notices += 1
            elif isinstance(d, Cancel):
                out.cancelled += 1
            elif isinstance(d, Act):
                out.stop.append(lid)
        return out


__all__ = ["DAY", "WINDOW", "IdleReclaim", "NotebookLife", "Outcome", "signals"]
