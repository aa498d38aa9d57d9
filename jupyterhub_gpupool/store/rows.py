"""Small conversions between rows and values that several store modules share."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .. import orm
from ..pool.model import Offer
from ..pool.quota import QuotaSpec
from .errors import StoreError


def utcnow() -> datetime:
    """Naive UTC now (the database stores naive UTC)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def ts(dt: datetime | None) -> str | None:
    """ISO 8601 with a ``Z`` (None stays None)."""
    return (
        None if dt is None else dt.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")
    )


def epoch(dt: datetime) -> float:
    """Epoch seconds of a naive UTC datetime."""
    return dt.replace(tzinfo=timezone.utc).timestamp()


def held_hours(row: orm.LeaseRow, start: datetime, end: datetime) -> float:
    """Unit-hours ``row`` was held within [start, end)."""
    if row.granted is None:
        return 0.0
    a = max(row.granted, start)
    b = min(row.released or end, end)
    return max(0.0, (b - a).total_seconds() / 3600.0) * row.units_f


def check_quota_kind(kind: str) -> str:
    """Quotas exist for ``users`` and ``groups`` (the URL's kind); returns the row's kind."""
    if kind not in ("users", "groups"):
        raise StoreError(
            "not_found", f"no quota kind {kind!r}", field="kind", allowed=["users", "groups"]
        )
    return kind[:-1]


def set_quota(row: orm.QuotaRow, spec: QuotaSpec) -> None:
    """Write a validated quota into its row."""
    row.guarantee = float(spec.guarantee)
    row.limit = None if spec.limit is None else float(spec.limit)
    row.budget = None if spec.budget is None else float(spec.budget)
    row.period = spec.period


def offer_spec(offer: Offer) -> dict[str, Any]:
    """An offer as stored and served (unset fields left out)."""
    spec = {
        "name": offer.name,
        "kind": offer.kind,
        "display_name": offer.display_name,
        "description": offer.description,
        "count": offer.count,
        "profile": offer.profile,
        "models": list(offer.models),
        "fraction": offer.fraction,
        "min_memory_gb": offer.min_memory_gb,
        "cpu_milli": offer.cpu_milli,
        "memory_mib": offer.memory_mib,
        "groups": list(offer.groups),
        "priority_class": offer.priority_class,
        "reclaim_policy": offer.reclaim_policy,
        "idle_timeout": offer.idle_timeout,
    }
    return {k: v for k, v in spec.items() if v is not None}


def node_json(row: orm.NodeRow) -> dict[str, Any]:
    """A node as the admin endpoints answer it."""
    return {
        "name": row.name,
        "cluster": row.cluster,
        "cordoned": row.cordoned,
        "draining": row.draining,
        "unreachable": row.unreachable,
        "gpus": len(row.gpus),
        "source": row.source,
    }
