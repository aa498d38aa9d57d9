"""Headroom: GPUs that borrowing by a preemptible class may not take (the pool config's
``borrowing: {keep_free: N}``; off unless set).

A preemptible class (training) borrows idle capacity and gives it back with a notice when
someone within guarantee needs it. In a busy pool, borrowed training fills every free GPU, so
a notebook within its guarantee waits for the notice's grace (the training's checkpoint,
300 s by default) and a user's second server (beyond guarantee: nothing is taken for it)
waits until a GPU frees. Headroom keeps ``keep_free`` GPUs of a model free of that borrowing
(as Kueue's ``lendingLimit`` keeps capacity from being lent):

* **the grant rule** (:meth:`Headroom.held_back`, :meth:`Headroom.breached`; the allocator's
  ``decide`` and ``next_grant``): a *borrowed* grant to a *preemptible* class is not made if
  it would leave fewer than ``keep_free`` free units of the GPU model it lands on; another
  model the offer allows may take it, else it waits with the reason ``headroom``. Grants
  within guarantee (a training with a quota of its own) and grants of classes that are never
  preempted (interactive, inference) may use the headroom: it is kept *for* them;
* **the refill** (:func:`refill`; the ``PreemptJobs`` rule, ``pool.rules.jobs``): when
  non-preemptible grants used the headroom up, borrowed leases of a preemptible class get
  their notice (their class's grace) until the free units, with those already leaving,
  are back to ``keep_free``: the *next* notebook then finds a free GPU, rather than waiting
  the grace. Without the refill the first ``keep_free`` arrivals of a busy hour use the
  headroom and the next wait as before, for as long as the trainings run (hours).

**Held nodes** (:meth:`Allocator.headroom_free`): the free units of a node the allocator holds
for a long waiter (``pool.reservation``: the starvation guard keeps later waiters off it
until the waiter fits) are not counted as headroom once that waiter has aged past the
priority of every class never preempted (:meth:`Headroom.holds_out`): a notebook or a
service asking then ranks after it and may not use them. Without that, on a loaded day a
large training waiting past the notebooks' priority (one level per ``aging_interval``: 50
levels, about 8.3 h) holds a node, the GPUs freed there count as the headroom, nothing is
refilled, and notebooks wait behind it. (Before it has aged that far a notebook ranks ahead
and may take them: they count.) A grant on a held node (to the waiter it
is held for, or one ranked ahead of it) takes nothing from the headroom and is never held
back by it; the refill gives no notice to a lease on a held node (what it frees is not
headroom), and counts none leaving there.

**Sticky holds** (:func:`kept_hold`, :func:`hold_changes`): the node held for a long waiter
is kept until the waiter is granted or gone, not chosen afresh at every pass. Chosen afresh
(``reservation.node_to_hold``: the node with the most free and takeable units), the GPUs a
refill frees elsewhere could make another node the held one; its free GPUs then left the
count and called for another refill (at ``keep_free: 5`` the month's replay gave 4,711
notices instead of 1,378). The ``PreemptJobs`` round says which node each long waiter holds
(``pool.effects.NodeHeld``: remembered on the waiter, ``Waiter.hold``, and in its row, so a
restarted or second process holds the same one); every later choice keeps it while the waiter
could still be served there: the node is in the pool, schedulable for the waiter's offer
(``reservation.usable``: not drained, cordoned or unreachable, enough healthy GPUs of its
models), in its clusters, not held for a waiter ahead, and no other node it could use is
less pinned (held by fewer units within guarantee: a notebook granted on the node while it
outranked a young waiter pins it for hours). Else a node is chosen afresh, and the next round
remembers that one.

What it trades: ``keep_free`` GPUs of each model stay idle while nothing else asks (training
served less), for notebooks and services that find a GPU at once while no more than
``keep_free`` of them arrive within one grace period. Free units are counted as the pool's
capacity view counts them (``Gpu.free_units``: a whole free GPU is 1, free MIG slices and
shares their part; GPUs of cordoned, draining or unreachable nodes and unhealthy ones not).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .errors import ConfigError, UnknownModel
from .limits import MAX_GPUS, MAX_NAME, shown
from .model import Node
from .workloads import INTERACTIVE, WorkloadClass

#: The wait reason of a request held back by the headroom (``Queued.reason``).
HEADROOM = "headroom"
#: The fields of the ``borrowing:`` section.
FIELDS = ("keep_free",)
_EPS = 1e-9


@dataclass(frozen=True)
class Headroom:
    """GPUs per model kept from borrowing by the ``preemptible`` classes: ``every`` of each
    model unless ``models`` names it."""

    every: int = 0
    models: Mapping[str, int] = field(default_factory=dict)
    #: The preemptible workload classes (their borrowed grants are held back).
    preemptible: frozenset[str] = frozenset()
    #: The lowest queue priority of a class never preempted (``workloads.request_priority``
    #: at offer priority 0): a node held for a waiter aged above it is out of the count.
    kept_for: int = 0

    def keep(self, model: str) -> int:
        """GPUs of ``model`` kept free."""
        return self.models.get(model, self.every)

    @property
    def on(self) -> bool:
        """Whether anything is kept (some model, and a class it is kept from)."""
        return bool(self.preemptible) and (self.every > 0 or any(self.models.values()))

    def held_back(self, workload: str | None, borrowed: bool) -> bool:
        """Whether a grant of class ``workload`` that ``borrowed`` is subject to the rule."""
        return borrowed and workload in self.preemptible

    def describe(self) -> str:
        """``keep_free 2``, ``keep_free H100-80GB 3, A100-80GB 1`` or ``none``."""
        if self.models:
            kept = ", ".join(f"{m} {n}" for m, n in self.models.items() if n)
            return f"keep_free {kept}" if kept else "none"
        return f"keep_free {self.every}" if self.every else "none"

    def holds_out(self, priority: int) -> bool:
        """Whether a node held for a long waiter of effective ``priority`` is out of the
        count: the waiter ranks ahead of any new ask of a class never preempted (a notebook
        within guarantee is served first at the same level), so no such ask may use it."""
        return priority > self.kept_for

    def breached(self, free: Mapping[str, float], model: str, units: Fraction | float) -> bool:
        """Whether taking ``units`` of ``model`` leaves fewer than it keeps free."""
        keep = self.keep(model)
        return keep > 0 and free.get(model, 0.0) - float(units) < keep - _EPS


def parse_borrowing(raw: object, models: Collection[str], path: str = "borrowing") -> Headroom:
    """The ``borrowing:`` section: ``keep_free: N`` (GPUs of every model) or ``keep_free:
    {MODEL: N, ...}`` (the models named; the others keep none). N is a whole number of GPUs
    from 0 to ``MAX_GPUS``; ``models`` are the catalog's names. The classes are added by
    :func:`headroom_for`."""
    if raw is None:
        return Headroom()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"must be a mapping (keep_free), got {shown(raw)}", field=path)
    unknown = set(raw) - set(FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
            field=path,
            allowed=list(FIELDS),
        )
    value = raw.get("keep_free", 0)
    if isinstance(value, Mapping):
        out: dict[str, int] = {}
        for model, n in value.items():
            where = f"{path}.keep_free.{str(model)[:MAX_NAME]}"
            if model not in models:
                raise UnknownModel(
                    f"unknown GPU model {shown(model)}", field=where, allowed=sorted(models)
                )
            out[str(model)] = _gpus(n, where)
        return Headroom(0, out)
    return Headroom(_gpus(value, f"{path}.keep_free"))


def _gpus(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
        raise ConfigError(
            f"must be a whole number of GPUs from 0 to {MAX_GPUS:,} (or a mapping of GPU "
            f"model → GPUs), got {shown(value)}",
            field=where,
        )
    return value


def headroom_for(
    headroom: Headroom, classes: Mapping[str, WorkloadClass] | Iterable[WorkloadClass]
) -> Headroom | None:
    """``headroom`` kept from the preemptible ``classes``; None when it keeps nothing (the
    allocator then decides as it always did)."""
    values = list(classes.values() if isinstance(classes, Mapping) else classes)
    base = next((c.priority for c in values if c.name == INTERACTIVE), 0)
    out = Headroom(
        headroom.every,
        dict(headroom.models),
        frozenset(c.name for c in values if c.preemptible),
        min((c.priority - base for c in values if not c.preemptible), default=0),
    )
    return out if out.on else None


def free_by_model(
    states: Iterable[tuple[Node, int]], held: Iterable[Node] = ()
) -> dict[str, float]:
    """Free units per GPU model of schedulable nodes, from ``(node, how many nodes are in its
    state)`` pairs (one node of each state: the allocator's index), less those of the
    ``held`` nodes (each one of the nodes counted: the headroom's count leaves out a node
    held for a long waiter)."""
    out: dict[str, float] = {}
    for node, count in states:
        if not node.schedulable:
            continue
        for g in node.gpus:
            out[g.model.name] = out.get(g.model.name, 0.0) + g.free_units() * count
    for node in held:
        if node.schedulable:
            for g in node.gpus:
                out[g.model.name] -= g.free_units()
    return out


def kept_hold(
    remembered: str | None,
    nodes: Iterable[tuple[Node, float | None]],
    clusters: Collection[str] | None,
    taken: Collection[str],
    pinned: Mapping[str, float],
) -> str | None:
    """The node a long waiter keeps holding: ``remembered`` (its ``Waiter.hold``) while it
    could still serve the waiter: it is one of ``nodes`` (the schedulable nodes, each with its
    ``reservation.usable`` free capacity for the waiter's offer, None when fewer of its GPUs
    than one grant needs could serve it), in ``clusters`` (None: any), and not ``taken``
    (held for a waiter ahead); and while no other such node is less ``pinned`` (units held
    within guarantee, ``reservation.pinned_units``): a notebook granted there before the
    waiter outranked it pins it for hours, and the node chosen afresh is the least pinned.
    None: choose afresh (``reservation.node_to_hold``)."""
    if remembered is None or remembered in taken:
        return None
    mine: float | None = None
    low = float("inf")
    for node, usable in nodes:
        if usable is None or (clusters is not None and node.cluster not in clusters):
            if node.name == remembered:
                return None
            continue
        p = pinned.get(node.name, 0.0)
        if node.name == remembered:
            mine = p
        elif node.name not in taken:
            low = min(low, p)
    if mine is None or mine > low + _EPS:
        return None
    return remembered


def hold_changes(
    holds: Mapping[str, str], remembered: Mapping[str, str | None]
) -> list[tuple[str, str | None]]:
    """(waiter id, node) for each waiter whose held node now (``holds``:
    ``Allocator.holds``) is not the one ``remembered`` for it (waiter id → ``Waiter.hold``,
    every waiter queued): the node to remember, or None to forget one (it no longer holds
    any). Sorted by waiter id."""
    out: list[tuple[str, str | None]] = []
    for wid in sorted(remembered):
        now = holds.get(wid)
        if now != remembered[wid]:
            out.append((wid, now))
    return out


def wait_message(model: str, keep: int) -> str:
    """What a request held back says (its queue message)."""
    return (
        f"{keep} {model} GPU{'s are' if keep != 1 else ' is'} kept free for work that is never "
        "preempted (borrowing.keep_free): borrowed capacity for a preemptible class waits "
        "until more are free"
    )


def refill_reason(model: str, keep: int) -> str:
    """What a refill's preemption notice says."""
    return (
        f"preempted: the pool keeps {keep} {model} GPU{'s' if keep != 1 else ''} free for "
        "notebooks and services (borrowing.keep_free)"
    )


@dataclass(frozen=True)
class Borrower:
    """A borrowed lease of a preemptible class, as the refill sees it."""

    id: str
    model: str
    units: Fraction
    granted_at: float


def deficits(
    headroom: Headroom, free: Mapping[str, float], leaving: Mapping[str, float]
) -> dict[str, float]:
    """Units per model still missing from what it keeps free, counting ``leaving`` (units
    already under a notice, not promised to a waiter) as free. Only the models ``free``
    counts (those of schedulable nodes): a model the pool has none of misses nothing."""
    out = {}
    for model in sorted(free):
        short = headroom.keep(model) - free.get(model, 0.0) - leaving.get(model, 0.0)
        if short > _EPS:
            out[model] = short
    return out


def refill(
    headroom: Headroom,
    free: Mapping[str, float],
    leaving: Mapping[str, float],
    borrowers: Iterable[Borrower],
) -> list[Borrower]:
    """The borrowed leases of a preemptible class that get a notice so each model's free
    units (with those ``leaving``) are back to what it keeps free.

    Per model short of its headroom, greedily: the smallest lease that covers what is still
    missing (one notice, the fewest GPUs freed), else the largest (the fewest notices); the
    youngest first among equals (the least work lost). Nothing for a model none can refill.
    """
    short = deficits(headroom, free, leaving)
    if not short:
        return []
    by_model: dict[str, list[Borrower]] = {}
    for b in borrowers:
        if b.model in short:
            by_model.setdefault(b.model, []).append(b)
    out: list[Borrower] = []
    for model, missing in short.items():
        pool = sorted(by_model.get(model, []), key=lambda b: (-b.granted_at, b.id))
        while missing > _EPS and pool:
            covering = [b for b in pool if float(b.units) >= missing - _EPS]
            pick = (
                min(covering, key=lambda b: b.units)
                if covering
                else max(pool, key=lambda b: b.units)
            )
            pool.remove(pick)
            out.append(pick)
            missing -= float(pick.units)
    return out


__all__ = [
    "FIELDS",
    "HEADROOM",
    "Borrower",
    "Headroom",
    "deficits",
    "free_by_model",
    "headroom_for",
    "hold_changes",
    "kept_hold",
    "parse_borrowing",
    "refill",
    "refill_reason",
    "wait_message",
]
