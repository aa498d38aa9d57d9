"""A MIG re-partition as the pool answers it: what was asked of which GPU, how it is
delivered (the node's agent or its label), where it stands, and, while it is open, its plan
(``pool.repartition.Plan``: what goes, comes, stays and stands in the way)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ... import orm
from ...pool.repartition import Plan

__all__ = [
    "LayoutSlice",
    "RepartitionPlanView",
    "RepartitionView",
    "layout_of",
    "repartition_view",
]


@dataclass(frozen=True)
class LayoutSlice:
    """One MIG instance of the asked layout: its profile and start slice."""

    profile: str
    start: int


@dataclass(frozen=True)
class RepartitionView:
    """A re-partition of ``gpu`` on ``node`` to ``layout``; ``plan`` only while it is open
    (``waiting`` or ``applying``) and its GPU is known, else None."""

    id: int
    node: str
    gpu: str
    layout: tuple[LayoutSlice, ...]
    method: str
    state: str
    actor: str
    created: datetime
    updated: datetime
    error: str | None
    plan: Plan | None


def layout_of(rep: orm.MigRepartitionRow) -> tuple[LayoutSlice, ...]:
    """The layout the row keeps, typed."""
    return tuple(LayoutSlice(i["profile"], i["start"]) for i in rep.layout)


def repartition_view(rep: orm.MigRepartitionRow, plan: Plan | None) -> RepartitionView:
    """``rep`` with its ``plan`` (the caller plans an open one against its GPU's holders)."""
    return RepartitionView(
        id=rep.id,
        node=rep.node,
        gpu=rep.gpu_uuid,
        layout=layout_of(rep),
        method=rep.method,
        state=rep.state,
        actor=rep.actor,
        created=rep.created,
        updated=rep.updated,
        error=rep.error,
        plan=plan,
    )


@dataclass(frozen=True)
class RepartitionPlanView:
    """A re-partition's preview (``dry_run``): its ``plan`` and how the node would get the
    layout (``method``: ``pool.repartition.delivery``)."""

    plan: Plan
    method: str
