"""The reclaimer's JSON: the reclaim policies (``GET|PUT|DELETE reclaim/policies``), the
leader lock (``POST|DELETE reclaim/leader``), a round's decisions (``POST reclaim/rounds``),
and the user's past reclaims and withdrawn notices (the user's page)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ...pool.reclaimpolicy import ReclaimPolicy
from ...store.read.reclaim import (
    LeaderView,
    PastReclaimView,
    ReclaimDecisionView,
    ReclaimMinute,
    ReclaimPolicyView,
    ReclaimRoundView,
    WithdrawnNoticeView,
)
from ...timeparse import format_time

__all__ = [
    "decision_json",
    "leader_json",
    "minute_json",
    "past_reclaim_json",
    "policy_json",
    "reclaim_policy_json",
    "round_json",
    "withdrawn_notice_json",
]


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


def leader_json(view: LeaderView) -> dict[str, Any]:
    """``holder``, ``expires`` and ``leader``."""
    return {"holder": view.holder, "expires": format_time(view.expires), "leader": view.leader}


def decision_json(d: ReclaimDecisionView) -> dict[str, Any]:
    """Who and what, ``kind`` and ``reason``, then each further field the decision says (one
    it does not say is left out, not null), in the order the reclaimer and the notify hook
    have always read them."""
    out: dict[str, Any] = {
        "lease": d.lease,
        "user": d.user,
        "server": d.server,
        "offer": d.offer,
        "offer_name": d.offer_name,
        "kind": d.kind,
        "reason": d.reason,
    }
    said: tuple[tuple[str, Any], ...] = (
        ("action", d.action),
        ("deadline", format_time(d.deadline)),
        ("release_reason", d.release_reason),
        ("target_offer", d.target_offer),
        ("target_lease", d.target_lease),
        ("evidence", None if d.evidence is None else dict(d.evidence)),
        ("notice_kind", d.notice_kind),
        ("heading", d.heading),
        ("keep", d.keep),
        ("why_not_kept", d.why_not_kept),
    )
    out.update((k, v) for k, v in said if v is not None)
    return out


def round_json(view: ReclaimRoundView) -> dict[str, Any]:
    """``now`` (epoch seconds), the ``decisions`` and the ``stale`` count."""
    return {
        "now": view.now,
        "decisions": [decision_json(d) for d in view.decisions],
        "stale": view.stale,
    }


def minute_json(m: ReclaimMinute) -> dict[str, Any]:
    """``minute``, ``util_mean`` and ``memory_used_mib_max``."""
    return {
        "minute": format_time(m.minute),
        "util_mean": m.util_mean,
        "memory_used_mib_max": m.memory_used_mib_max,
    }


def past_reclaim_json(r: PastReclaimView) -> dict[str, Any]:
    """A past reclaim, with its lease's last hour (``utilization``)."""
    return {
        "lease": r.lease,
        "offer": r.offer,
        "server": r.server,
        "at": format_time(r.at),
        "kind": r.kind,
        "action": r.action,
        "reason": r.reason,
        "release_reason": r.release_reason,
        "saved": list(r.saved),
        "outcome": r.outcome,
        "detail": r.detail,
        "utilization": [minute_json(m) for m in r.utilization],
    }


def withdrawn_notice_json(w: WithdrawnNoticeView) -> dict[str, Any]:
    """A withdrawn notice: ``lease``, ``offer``, ``server``, ``at``, ``kind``, ``reason``."""
    return {
        "lease": w.lease,
        "offer": w.offer,
        "server": w.server,
        "at": format_time(w.at),
        "kind": w.kind,
        "reason": w.reason,
    }
