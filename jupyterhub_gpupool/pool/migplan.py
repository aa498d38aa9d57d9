"""Dynamic MIG: what a node must create or destroy so its GPUs match the pool's layout.

Why a plan and not commands: the pool's wanted layout (instances declared, planned for grants,
or held) and what the node last reported can drift (an agent away, a creation that failed, an
instance made by hand). Deriving the actions from the two every time makes delivery idempotent:
an agent that missed a plan gets the same one again, and one that applied it twice changes
nothing. Pure values in, pure values out; the store feeds it rows and records the outcome.

Rules (docs/source/howto/node-agent.md "Dynamic MIG"):

* **create** a wanted instance the node does not report, at the pool's placement, until it has
  failed ``max_attempts`` times;
* **destroy** a reported instance the pool does not want (made for a lease since released, or
  found on a dynamic GPU without being planned), but never one with processes on it, nor once
  destroying it failed ``max_attempts`` times;
* destroys come first: a creation may need the memory slices a destroy frees;
* a creation whose memory slices an unwanted instance holds that cannot go (busy, or given up)
  is *blocked*: it can never succeed there, so the store fails it at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .catalog import GpuModel
from .errors import PoolError
from .miglayout import validate_mig_layout
from .model import RETIRING, MigInstance

#: Failed attempts at one action before the pool gives up on it (the store's default).
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Wanted:
    """An instance the pool wants on a GPU (declared, planned for a grant, or held)."""

    profile: str
    start: int
    attempts: int = 0  # failed creations so far


@dataclass(frozen=True)
class Seen:
    """An instance the node reported (its last inventory, or a creation it reported since)."""

    profile: str
    start: int
    uuid: str | None = None
    processes: int | None = None  # None: the node could not tell
    attempts: int = 0  # failed destructions so far


@dataclass(frozen=True)
class GpuLayout:
    """One dynamic-MIG GPU: what the pool wants and what the node has."""

    gpu: str
    model: GpuModel
    wanted: tuple[Wanted, ...]
    seen: tuple[Seen, ...]


@dataclass
class GpuPlan:
    """The actions for one GPU, and the wanted instances that cannot be made where planned."""

    actions: list[dict[str, object]] = field(default_factory=list)
    blocked: list[Wanted] = field(default_factory=list)


def _mask(model: GpuModel, profile: str, start: int) -> int:
    """Memory slices the instance covers, as bits (an unknown profile covers nothing)."""
    try:
        size = model.profile(profile).memory_slices
    except PoolError:
        return 0
    return ((1 << size) - 1) << start


def plan_gpu(layout: GpuLayout, max_attempts: int = MAX_ATTEMPTS) -> GpuPlan:
    """Destroy the unwanted idle instances, then create the wanted missing ones (see module)."""
    out = GpuPlan()
    wanted = {(w.profile, w.start) for w in layout.wanted}
    seen = {(s.profile, s.start) for s in layout.seen}
    stuck = 0  # memory slices held by unwanted instances that stay
    for s in sorted(layout.seen, key=lambda s: s.start):
        if (s.profile, s.start) in wanted:
            continue
        if s.processes or s.attempts >= max_attempts:
            stuck |= _mask(layout.model, s.profile, s.start)
            continue
        out.actions.append(
            {"op": "destroy", "gpu": layout.gpu, "profile": s.profile, "start": s.start}
        )
    for w in sorted(layout.wanted, key=lambda w: w.start):
        if (w.profile, w.start) in seen or w.attempts >= max_attempts:
            continue
        if _mask(layout.model, w.profile, w.start) & stuck:
            out.blocked.append(w)
            continue
        out.actions.append(
            {"op": "create", "gpu": layout.gpu, "profile": w.profile, "start": w.start}
        )
    return out


def plan_node(
    layouts: Iterable[GpuLayout], max_attempts: int = MAX_ATTEMPTS
) -> list[dict[str, Any]]:
    """The actions of every dynamic GPU of a node, GPU by GPU (blocked creations left out)."""
    actions: list[dict[str, Any]] = []
    for layout in layouts:
        actions += plan_gpu(layout, max_attempts).actions
    return actions


def mig_key(entry: Mapping[str, Any]) -> tuple[str, int]:
    """(profile, start) of an instance entry of what a node reported, or of a MIG result."""
    return str(entry["profile"]), int(entry["start"])


def with_retiring(
    model: GpuModel,
    instances: list[MigInstance],
    observed: Iterable[tuple[str, int, str | None]],
) -> list[MigInstance]:
    """A dynamic GPU's instances for the allocator: the wanted ``instances``, and the unwanted
    ones its node still has (``observed``: (profile, start, uuid)), held by ``RETIRING`` so
    nothing goes over them. One in the way of a wanted instance (made by hand, found late) is
    left out: the plan destroys it first, or fails the grant when it cannot go."""
    out = list(instances)
    wanted = {(i.profile, i.start) for i in instances}
    for profile, start, uuid in observed:
        if (profile, start) in wanted:
            continue
        try:
            validate_mig_layout(model, [(i.profile, i.start) for i in out] + [(profile, start)])
        except PoolError:
            continue
        out.append(MigInstance(profile, start, uuid, RETIRING))
    return out
