"""A quota's JSON (``GET|PUT|PATCH|DELETE quotas/{kind}/{name}``): the quota in effect, every
field in GPU units as a float (None: unset), and where it comes from."""

from __future__ import annotations

from typing import Any

from ...pool.quota import QuotaSpec
from ...store.read.quotas import QuotaView

__all__ = ["quota_json", "quota_spec_json"]


def quota_spec_json(spec: QuotaSpec) -> dict[str, Any]:
    """The spec's fields in the order the API and the forms show them
    (``pool.quota.QUOTA_FIELDS``), in GPU units as floats (None: unset)."""
    return {
        "guarantee": float(spec.guarantee),
        "limit": None if spec.limit is None else float(spec.limit),
        "budget": None if spec.budget is None else float(spec.budget),
        "period": spec.period,
        "exception": None if spec.exception is None else float(spec.exception),
        "budget_action": spec.budget_action,
        "budget_minimum": float(spec.budget_minimum),
    }


def quota_json(quota: QuotaView) -> dict[str, Any]:
    """``name``, ``kind`` (``user`` | ``group``), ``source`` and the spec's fields
    (``quota_spec_json``)."""
    return {
        "name": quota.name,
        "kind": quota.kind,
        "source": quota.source,
        **quota_spec_json(quota.spec),
    }
