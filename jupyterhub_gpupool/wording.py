"""How the pool's numbers read to people, the same on the spawn page, the picker and the pool's
own pages: "1/7 GPU", "1 1/2 GPUs", "2nd in line"."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st …"""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def units_text(units: float | None) -> str:
    """GPU units as people read them: 1/7 GPU, 1/4 GPU, 2 GPUs, 1 1/7 GPUs, 0 GPUs."""
    units = float(units or 0)
    whole = int(units + 1e-9)
    rest = units - whole
    if rest > 1e-6:
        for d in (2, 3, 4, 7, 8):
            if abs(rest * d - round(rest * d)) < 1e-6:
                frac = f"{round(rest * d)}/{d}"
                return f"{frac} GPU" if not whole else f"{whole} {frac} GPUs"
        return f"{units:.2f} GPU" + ("s" if units > 1 else "")
    return f"{whole} GPU" + ("s" if whole != 1 else "")


def asked_ago(lease: dict[str, Any], now: float | None = None) -> str:
    """ "asked 14 min ago" for a lease awaiting approval (from its ``approval.asked``)."""
    asked = (lease.get("approval") or {}).get("asked")
    try:
        at = datetime.fromisoformat(str(asked).replace("Z", "+00:00"))
    except ValueError:
        return "asked just now"
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    seconds = max(0.0, (now if now is not None else time.time()) - at.timestamp())
    if seconds < 60:
        return "asked just now"
    if seconds < 5400:
        return f"asked {round(seconds / 60)} min ago"
    if seconds < 86400 * 2:
        return f"asked {round(seconds / 3600)} h ago"
    return f"asked {round(seconds / 86400)} days ago"
