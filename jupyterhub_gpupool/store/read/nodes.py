"""A node as the admin endpoints answer it, and the answers of the node commands: a cordon or
uncordon (with the drain notices an uncordon withdrew) and a drain (with its deadline and
what it did to the node's leases)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ... import orm

__all__ = ["NodeDrainView", "NodeSetView", "NodeView", "node_set_view", "node_view"]


@dataclass(frozen=True)
class NodeView:
    """A node's flags, its number of GPUs, and where it came from (``config``, ``agent``,
    ``kube``, ...)."""

    name: str
    cluster: str
    cordoned: bool
    draining: bool
    unreachable: bool
    gpus: int
    source: str


@dataclass(frozen=True)
class NodeSetView:
    """A cordon, uncordon or drain without a deadline: the node after it; for an uncordon,
    the leases whose drain notices it withdrew (None for the others)."""

    node: NodeView
    withdrawn: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NodeDrainView:
    """A drain: the node after it, its deadline (None: none), how many leases got a notice
    ending then and how many grants not yet bound were released at once."""

    node: NodeView
    deadline: datetime | None
    noticed: int
    released: int


def node_view(row: orm.NodeRow) -> NodeView:
    """The node of ``row``."""
    return NodeView(
        name=row.name,
        cluster=row.cluster,
        cordoned=row.cordoned,
        draining=row.draining,
        unreachable=row.unreachable,
        gpus=len(row.gpus),
        source=row.source,
    )


def node_set_view(row: orm.NodeRow, withdrawn: Iterable[str] | None = None) -> NodeSetView:
    """The answer of a cordon, uncordon (``withdrawn``) or plain drain on ``row``."""
    return NodeSetView(node_view(row), None if withdrawn is None else tuple(withdrawn))
