"""A user's or group's quota in effect and where it comes from (``GET quotas/{kind}/{name}``
and the answer of a set, patch or reset).

The view is the pool's own value, ``pool.quota.QuotaInEffect`` (``QuotaView`` here): the
``PatchQuota`` rule reads it and a quota edit answers it, so the store and the rule share one
type rather than the rule reading the API's JSON."""

from __future__ import annotations

from ... import orm
from ...pool.quota import QuotaInEffect, QuotaSpec

__all__ = ["QuotaView", "quota_spec", "quota_view"]

#: The quota in effect: ``name``, ``kind`` (``user`` | ``group``), ``source`` and ``spec``.
QuotaView = QuotaInEffect


def quota_spec(row: orm.QuotaRow) -> QuotaSpec:
    """The quota ``row`` holds, validated as the pool config's are (``QuotaSpec.parse``: the
    same exact fractions the allocator holds, whose floats are the row's own)."""
    return QuotaSpec.parse(
        {
            "guarantee": row.guarantee,
            "limit": row.limit,
            "budget": row.budget,
            "period": row.period,
            "exception": row.exception,
            "budget_action": row.budget_action,
            "budget_minimum": row.budget_minimum,
        },
        f"quotas.{row.kind}s.{row.name}",
    )


def quota_view(kind: str, name: str, row: orm.QuotaRow | None, source: str) -> QuotaView:
    """The quota of ``name`` (``kind``: ``user`` | ``group``) as ``row`` holds it (None: no
    quota at all, the spec's defaults), from ``source``."""
    return QuotaView(name, kind, source, QuotaSpec() if row is None else quota_spec(row))
