"""Re-partitioning a GPU to a new MIG layout, as a plan an admin reads before it runs.

An admin asks for a layout (``[(profile, start), ...]``); the plan says which instances go,
which come, which stay, and which leases hold an instance (or the whole GPU) that must go: the
leases *in the way*. The store runs the plan only once nothing is in the way, and leaves *how*
the node gets there to the node's kind (a dynamic-MIG node's agent through its ``mig-plan``,
a Kubernetes node through the ``nvidia.com/mig.config`` label): this module decides nothing
about delivery. Pure values in, pure values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .catalog import GpuModel
from .errors import PoolError
from .miglayout import validate_mig_layout


@dataclass(frozen=True)
class Held:
    """Something on the GPU now: a MIG instance (``profile``/``start``) or the whole GPU or a
    share of it (``profile`` None), with the lease holding it (None: free)."""

    profile: str | None
    start: int | None
    lease: str | None = None
    user: str | None = None


@dataclass
class Plan:
    """What a re-partition does to one GPU."""

    gpu: str
    model: str
    target: list[tuple[str, int]]
    go: list[Held] = field(default_factory=list)
    come: list[tuple[str, int]] = field(default_factory=list)
    keep: list[Held] = field(default_factory=list)
    in_way: list[Held] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Nothing held stands in the way: the plan may run now."""
        return not self.in_way

    def to_json(self) -> dict[str, object]:
        """The plan as the API answers it."""

        def held(h: Held) -> dict[str, object]:
            return {"profile": h.profile, "start": h.start, "lease": h.lease, "user": h.user}

        return {
            "gpu": self.gpu,
            "model": self.model,
            "layout": [{"profile": p, "start": s} for p, s in self.target],
            "go": [held(h) for h in self.go],
            "come": [{"profile": p, "start": s} for p, s in self.come],
            "keep": [held(h) for h in self.keep],
            "in_way": [held(h) for h in self.in_way],
            "ready": self.ready,
            "mig_config": mig_config(self.target),
        }


def delivery(dynamic_mig: bool, mig_enabled: bool) -> str:
    """How a node gets a GPU's layout: its agent (dynamic MIG), else the node's label."""
    return "agent" if dynamic_mig and mig_enabled else "label"


def parse_layout(raw: object, where: str = "layout") -> list[tuple[str, int]]:
    """``[{"profile": "3g.40gb", "start": 0}, ...]`` as pairs (errors name the item's field)."""
    if not isinstance(raw, list):
        raise PoolError(f"{where} must be a list", field=where, code="invalid_field")
    out = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"profile", "start"}:
            raise PoolError("must be {profile, start}", field=at, code="invalid_field")
        profile, start = item.get("profile"), item.get("start")
        if not isinstance(profile, str) or not profile:
            raise PoolError(
                "must be a profile name (a non-empty string)",
                field=f"{at}.profile",
                code="invalid_field",
            )
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < 64:
            raise PoolError("must be 0 to 63", field=f"{at}.start", code="invalid_field")
        out.append((profile, start))
    return sorted(out, key=lambda p: p[1])


def plan_repartition(
    gpu: str,
    model: GpuModel,
    mig_enabled: bool,
    now: Sequence[Held],
    target: Iterable[Sequence[Any]],
) -> Plan:
    """The plan from what the GPU holds ``now`` to ``target`` (validated by NVIDIA's rules:
    ``MigLayoutError`` names the field). Switching a whole GPU to MIG puts every lease on it
    in the way."""
    wanted = sorted(((str(p), int(s)) for p, s in target), key=lambda p: p[1])
    validate_mig_layout(model, wanted)
    plan = Plan(gpu, model.name, wanted)
    present = set()
    for h in now:
        key = (h.profile, h.start)
        if mig_enabled and h.profile is not None and key in set(wanted):
            plan.keep.append(h)
            present.add(key)
            continue
        if h.profile is not None:
            plan.go.append(h)
        if h.lease is not None:
            plan.in_way.append(h)
    plan.come = [w for w in wanted if w not in present]
    return plan


def mig_config(target: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The layout as mig-parted counts (``{"1g.10gb": 7}``): what a ``nvidia.com/mig.config``
    entry declares (it places by count; the starts are the pool's choice on dynamic nodes)."""
    counts: dict[str, int] = {}
    for profile, _ in target:
        counts[profile] = counts.get(profile, 0) + 1
    return dict(sorted(counts.items()))
