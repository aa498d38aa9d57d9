"""A dynamic-MIG node's plan as the pool answers it (``GET nodes/{name}/mig-plan``, the
samples' answer, the service's own telemetry loop): one action per MIG instance to make or
remove, in the order the node carries them out (``pool.migplan.plan_node``). The MIG profiles
of the pool's models (the admin nodes page's re-partition form), and a node as a label
re-partition will leave it (the labeller's inventory)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...pool.allocator import Allocator
from ...pool.model import MigInstance, Node

__all__ = [
    "MigAction",
    "MigProfileView",
    "ModelProfilesView",
    "mig_actions",
    "model_profiles",
    "repartitioned_node",
]


@dataclass(frozen=True)
class MigAction:
    """``op`` (``create`` | ``destroy``) the instance of ``profile`` at slice ``start`` on the
    GPU ``gpu``."""

    op: str
    gpu: str
    profile: str
    start: int


def mig_actions(plan: Iterable[Mapping[str, Any]]) -> tuple[MigAction, ...]:
    """The pool's plan (``pool.migplan``'s actions) typed, in its order."""
    return tuple(
        MigAction(str(a["op"]), str(a["gpu"]), str(a["profile"]), int(a["start"])) for a in plan
    )


@dataclass(frozen=True)
class MigProfileView:
    """A MIG profile of a GPU model: its name, the slices it may start at, and its memory
    slices."""

    name: str
    starts: tuple[int, ...]
    memory_slices: int


@dataclass(frozen=True)
class ModelProfilesView:
    """A MIG-capable GPU model of the pool and its profiles (catalog order)."""

    model: str
    profiles: tuple[MigProfileView, ...]


def model_profiles(alloc: Allocator) -> tuple[ModelProfilesView, ...]:
    """The MIG-capable models of ``alloc``'s GPUs, in the order their first GPU comes."""
    out: dict[str, ModelProfilesView] = {}
    for g in alloc.gpus.values():
        if g.model.mig_capable and g.model.name not in out:
            out[g.model.name] = ModelProfilesView(
                g.model.name,
                tuple(
                    MigProfileView(p.name, tuple(p.starts), p.memory_slices)
                    for p in g.model.profiles.values()
                ),
            )
    return tuple(out.values())


def repartitioned_node(
    alloc: Allocator, node: str, layouts: Mapping[str, Iterable[tuple[str, int]]]
) -> Node | None:
    """``node`` as it will be once the GPUs of ``layouts`` (uuid → ``(profile, start)`` of
    each instance) have their new layout, the other GPUs as they are, nothing held (what a
    re-partition by label reports as the node's inventory). A copy: the allocator's own values
    are never handed out. None: not a node of the pool."""
    found = alloc.nodes.get(node)
    if found is None:
        return None
    gpus = []
    for g in found.gpus:
        if g.uuid in layouts:
            inst = [MigInstance(p, s) for p, s in layouts[g.uuid]]
        else:
            inst = [MigInstance(i.profile, i.start, i.uuid) for i in g.instances]
        mig = bool(inst) if g.uuid in layouts else g.mig_enabled
        gpus.append(replace(g, instances=inst, mig_enabled=mig, whole_lease=None, shares={}))
    return replace(found, gpus=gpus, labels=dict(found.labels), cpu_used=0, memory_used=0)
