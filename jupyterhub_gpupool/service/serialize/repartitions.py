"""A re-partition's JSON (``POST nodes/{name}/gpus/{gpu}/repartition``, ``GET repartitions``,
``DELETE repartitions/{id}``) and a re-partition's preview (``dry_run``)."""

from __future__ import annotations

from typing import Any

from ...store.read.repartitions import RepartitionPlanView, RepartitionView
from ...timeparse import format_time

__all__ = ["repartition_json", "repartition_plan_json"]


def repartition_json(rep: RepartitionView) -> dict[str, Any]:
    """The re-partition; ``plan`` is the pool's plan JSON (``Plan.to_json``) or null."""
    return {
        "id": rep.id,
        "node": rep.node,
        "gpu": rep.gpu,
        "layout": [{"profile": i.profile, "start": i.start} for i in rep.layout],
        "method": rep.method,
        "state": rep.state,
        "actor": rep.actor,
        "created": format_time(rep.created),
        "updated": format_time(rep.updated),
        "error": rep.error,
        "plan": None if rep.plan is None else rep.plan.to_json(),
    }


def repartition_plan_json(preview: RepartitionPlanView) -> dict[str, Any]:
    """The plan's JSON (``Plan.to_json``) and the ``method``."""
    return {**preview.plan.to_json(), "method": preview.method}
