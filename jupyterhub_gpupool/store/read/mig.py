"""A dynamic-MIG node's plan as the pool answers it (``GET nodes/{name}/mig-plan``, the
samples' answer, the service's own telemetry loop): one action per MIG instance to make or
remove, in the order the node carries them out (``pool.migplan.plan_node``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MigAction", "mig_actions"]


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
