"""A dynamic-MIG node's plan JSON (``GET nodes/{name}/mig-plan``, the samples' answer): the
actions the node's agent (or the service's telemetry loop) carries out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...store.read.mig import MigAction

__all__ = ["mig_action_json", "mig_plan_json"]


def mig_action_json(action: MigAction) -> dict[str, Any]:
    """``op``, ``gpu``, ``profile`` and ``start``."""
    return {"op": action.op, "gpu": action.gpu, "profile": action.profile, "start": action.start}


def mig_plan_json(actions: Iterable[MigAction]) -> list[dict[str, Any]]:
    """The plan's actions, in order."""
    return [mig_action_json(a) for a in actions]
