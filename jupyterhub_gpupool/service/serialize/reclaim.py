"""The reclaim policies' JSON (``GET|PUT|DELETE reclaim/policies``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ...pool.reclaimpolicy import ReclaimPolicy
from ...store.read.reclaim import ReclaimPolicyView

__all__ = ["policy_json", "reclaim_policy_json"]


def policy_json(policy: ReclaimPolicy) -> dict[str, Any]:
    """A resolved policy: every field by its name, durations in seconds, the exempt users and
    groups as sorted lists."""
    out = {f.name: getattr(policy, f.name) for f in fields(policy)}  # the pool's field order
    out["exempt_users"] = sorted(policy.exempt_users)
    out["exempt_groups"] = sorted(policy.exempt_groups)
    return out


def reclaim_policy_json(view: ReclaimPolicyView) -> dict[str, Any]:
    """``source``, the ``reclaim`` section as written, and the ``effective`` policies."""
    return {
        "source": view.source,
        "reclaim": dict(view.section),
        "effective": {
            "default": policy_json(view.default),
            "offers": {name: policy_json(p) for name, p in view.offers.items()},
        },
    }
