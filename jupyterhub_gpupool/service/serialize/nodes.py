"""A node's JSON (``PUT nodes/{name}/inventory``) and the node actions' answers
(``POST nodes/{name}/{cordon|uncordon|drain}``)."""

from __future__ import annotations

from typing import Any

from ...store.read.nodes import NodeDrainView, NodeSetView, NodeView
from ...timeparse import format_time

__all__ = ["node_drain_json", "node_json", "node_set_json"]


def node_json(node: NodeView) -> dict[str, Any]:
    """The node: its flags, its number of GPUs and its source."""
    return {
        "name": node.name,
        "cluster": node.cluster,
        "cordoned": node.cordoned,
        "draining": node.draining,
        "unreachable": node.unreachable,
        "gpus": node.gpus,
        "source": node.source,
    }


def node_set_json(answer: NodeSetView) -> dict[str, Any]:
    """The node; an uncordon adds ``withdrawn`` (the leases whose drain notices it ended)."""
    out = node_json(answer.node)
    if answer.withdrawn is not None:
        out["withdrawn"] = list(answer.withdrawn)
    return out


def node_drain_json(answer: NodeDrainView) -> dict[str, Any]:
    """The node with the drain's ``deadline``, ``noticed`` and ``released`` counts."""
    return {
        **node_json(answer.node),
        "deadline": format_time(answer.deadline),
        "noticed": answer.noticed,
        "released": answer.released,
    }
