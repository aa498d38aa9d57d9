"""What every open lab shows, built from the pool's answers: pure functions, no I/O.

The server extension asks the pool (``users/me``, ``utilization``, ``offers``) and hands the
answers here; the result is the one JSON document every tab, the widget and ``status()`` read,
so they cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

#: Lease states in which the server runs on the lease (or is about to).
HELD = ("granted", "active", "reclaiming")
#: Lease states of a request that still waits or holds (not released).
PENDING = ("awaiting_approval", "queued", "granted")

_FRACTIONS = {0.5: "½", 0.25: "¼", 0.75: "¾", 0.125: "⅛", 1 / 3: "⅓", 2 / 3: "⅔"}


def short_model(model: str | None) -> str:
    """``A100-80GB`` → ``A100``; ``H100-80GB`` → ``H100``; ``T4`` stays."""
    if not model:
        return "GPU"
    return re.sub(r"[-_ ]?\d+\s*GB$", "", model, flags=re.IGNORECASE) or model


def fraction_text(fraction: float) -> str:
    """``0.25`` → ``¼``; fractions without a glyph as a percentage."""
    for value, glyph in _FRACTIONS.items():
        if abs(fraction - value) < 1e-6:
            return glyph
    return f"{fraction * 100:.0f}%"


def device_label(lease: Mapping[str, Any] | None) -> str:
    """The status bar's device: ``A100 1g.10gb``, ``H100``, ``2× H100``, ``¼ T4``, ``CPU only``."""
    if not lease or lease.get("state") not in HELD:
        return "CPU only"
    slots = list(lease.get("slots") or [])
    model = short_model(lease.get("model"))
    if not slots:
        return model
    first = slots[0]
    if first.get("kind") == "mig":
        return f"{model} {first.get('profile')}"
    if first.get("kind") == "shared":
        return f"{fraction_text((first.get('milli') or 0) / 1000)} {model}"
    return model if len(slots) == 1 else f"{len(slots)}× {model}"


def memory_total_mib(lease: Mapping[str, Any] | None) -> int | None:
    """The slice's memory from its profile or model name (``1g.10gb``: 10 GiB; ``H100-80GB``:
    80 GiB, times the count; a shared slice its fraction of it); NVML's answer wins where the
    server has NVML."""
    if not lease or lease.get("state") not in HELD:
        return None
    slots = list(lease.get("slots") or [])
    model_gb = _gb(lease.get("model"))
    total = 0.0
    for s in slots:
        if s.get("kind") == "mig":
            gb = _gb(s.get("profile"))
            if gb is None:
                return None
            total += gb
        elif model_gb is None:
            return None
        elif s.get("kind") == "shared":
            total += model_gb * (s.get("milli") or 0) / 1000
        else:
            total += model_gb
    return round(total * 1024) if slots else None


def _gb(name: str | None) -> float | None:
    match = re.search(r"(\d+(?:\.\d+)?)\s*gb", name or "", flags=re.IGNORECASE)
    return float(match.group(1)) if match else None


def period_end(now: datetime, period: str) -> datetime:
    """When the unit-hour budget resets: the end of the day, ISO week (Monday) or calendar
    month containing ``now`` (UTC). The same periods as the pool's
    ``jupyterhub_gpupool.pool.quota.period_start``, copied so user images need not install
    the pool."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day + timedelta(days=1)
    if period == "week":
        return day - timedelta(days=day.weekday()) + timedelta(days=7)
    first = day.replace(day=1)
    return (first + timedelta(days=32)).replace(day=1)


def quota_view(me: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The quota bars: units held / guarantee / limit; unit-hours used / budget and the reset."""
    quota = dict(me.get("quota") or {})
    period = quota.get("period") or "month"
    return {
        "held_units": float(me.get("held_units") or 0.0),
        "guarantee": float(quota.get("guarantee") or 0.0),
        "limit": quota.get("limit"),
        "used_unit_hours": float(me.get("used_unit_hours") or 0.0),
        "budget": quota.get("budget"),
        "budget_action": quota.get("budget_action") or "refuse",
        "period": period,
        "resets_at": iso(period_end(now, period)),
    }


def pick_lease(
    leases: Iterable[Mapping[str, Any]], lease_id: str, server: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
    """(the lease this server runs on, a resize or GPU request pending for it, whether the
    server's ``GPUPOOL_LEASE_ID`` is stale).

    The environment's lease id wins while it is held. Once it is not (the server was restarted
    elsewhere, the lease ended), the server's live held lease is used, and the id is stale.
    """
    mine = [dict(le) for le in leases if le.get("server", "") == server]
    by_id = {le["id"]: le for le in mine}
    current = by_id.get(lease_id) if lease_id else None
    stale = bool(lease_id) and (current is None or current.get("state") not in HELD)
    if current is None or current.get("state") not in HELD:
        held = [le for le in mine if le.get("state") in HELD and not le.get("resize_of")]
        current = held[0] if held else None
    pending = None
    for le in mine:
        if current is not None and le["id"] == current["id"]:
            continue
        waiting = le.get("state") in PENDING or le.get("state") == "active"
        if waiting and (current is None or le.get("resize_of") == current["id"]):
            pending = le
            break
    return current, pending, stale


def offer_choices(
    offers: Iterable[Mapping[str, Any]], current_offer: str | None, quota: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The resize choices: every offer but the current one, free now or queued, its cost in
    units, and whether it fits the quota (or why not)."""
    out = []
    held = float(quota.get("held_units") or 0.0)
    for o in offers:
        if o.get("name") == current_offer:
            continue
        reason = o.get("quota_reason")
        out.append(
            {
                "name": o.get("name"),
                "display_name": o.get("display_name") or o.get("name"),
                "description": o.get("description") or "",
                "units": float(o.get("units") or 0.0),
                "available": int(o.get("available") or 0),
                "queue_length": int(o.get("queue_length") or 0),
                "eta_seconds": o.get("eta_seconds"),
                "fits": o.get("quota_ok") is not False,
                "why_not": QUOTA_REASONS.get(reason, reason) if reason else None,
                "held_after": None,  # filled below: the units held after moving
            }
        )
    for choice in out:
        choice["held_after"] = held  # the old lease is released when the new one binds
    return out


#: The pool's quota codes (pool/quota.py QUOTA_CODES) in words.
QUOTA_REASONS = {
    "no_quota": "your quota does not include GPUs",
    "exceeds_limit": "larger than your quota's limit",
    "over_limit": "over your limit while you hold other GPUs",
    "budget_exhausted": "your GPU-hour budget for this period is spent",
    "not_in_group": "not offered to your groups",
}


def iso(when: datetime) -> str:
    """UTC ISO 8601 with a ``Z``."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def lease_view(lease: Mapping[str, Any] | None, offers: Mapping[str, Mapping[str, Any]]) -> Any:
    """The lease as the panel shows it (None: CPU only)."""
    if lease is None:
        return None
    slots = list(lease.get("slots") or [])
    offer = offers.get(lease.get("offer") or "") or {}
    return {
        "id": lease.get("id"),
        "offer": lease.get("offer"),
        "offer_name": offer.get("display_name") or lease.get("offer"),
        "state": lease.get("state"),
        "model": lease.get("model"),
        "node": lease.get("node"),
        "since": lease.get("activated") or lease.get("granted"),
        "units": lease.get("units"),
        "borrowed": bool(lease.get("borrowed")),
        "device": device_label(lease),
        "memory_total_mib": memory_total_mib(lease),
        "devices": [
            {
                "kind": s.get("kind"),
                "gpu": s.get("gpu"),
                "uuid": s.get("mig_uuid") or s.get("gpu"),
                "profile": s.get("profile"),
                "start": s.get("start"),
                "parent": s.get("gpu") if s.get("kind") == "mig" else None,
            }
            for s in slots
        ],
        "reclaim": lease.get("reclaim"),
    }


def offer_name(offer: str | None, offers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The offer's display name, as users read it (its id only where the pool gives none)."""
    return (offers.get(offer or "") or {}).get("display_name") or offer


def pending_view(
    pending: Mapping[str, Any] | None, offers: Mapping[str, Mapping[str, Any]] | None = None
) -> Any:
    """A resize or GPU request that waits: its state, queue position and estimate."""
    if pending is None:
        return None
    return {
        "id": pending.get("id"),
        "offer": pending.get("offer"),
        "offer_name": offer_name(pending.get("offer"), offers or {}),
        "state": pending.get("state"),
        "position": pending.get("position"),
        "eta_seconds": pending.get("eta_seconds"),
        "ready": bool(pending.get("ready")),
        "resize_of": pending.get("resize_of"),
    }
