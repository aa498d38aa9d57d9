"""How the pool's numbers read to people, the same on the spawn page, the picker and the pool's
own pages: "1/7 GPU", "1 1/2 GPUs", "2nd in line"."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from .timeparse import parse_time


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
        at = parse_time(asked)
    except ValueError:
        return "asked just now"
    if at is None:
        return "asked just now"
    seconds = max(0.0, (now if now is not None else time.time()) - at.timestamp())
    if seconds < 60:
        return "asked just now"
    if seconds < 5400:
        return f"asked {round(seconds / 60)} min ago"
    if seconds < 86400 * 2:
        return f"asked {round(seconds / 3600)} h ago"
    return f"asked {round(seconds / 86400)} days ago"


def plural(n: int, word: str) -> str:
    """``1 unit``, ``2 units``, ``0 leases``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def wait_text(reason: str | None, message: str | None, offer: str) -> str:
    """Why a queued request waits, in words (``offer`` is the offer's display name): a capacity
    wait reads "waiting for a free 1× H100 80GB"; a quota wait gives the quota's own words."""
    if reason == "no_capacity":
        return f"waiting for a free {offer}"
    if reason == "fairness":
        return f"waiting: the free {offer} is kept for requests waiting longer"
    if reason == "headroom":
        return (
            f"waiting: the free {offer} is kept for notebooks and services "
            "(borrowed capacity for this class leaves some GPUs free)"
        )
    if reason == "quota":
        return f"waiting for room in the quota: {message}" if message else "waiting for quota"
    return message or "waiting"


def estimate_text(eta_seconds: float | None, offer: str) -> str:
    """A queue estimate, or why there is none yet (it comes from the last hour's releases)."""
    if eta_seconds is None:
        return f"none yet: no {offer} was released in the last hour"
    minutes = max(1, round(eta_seconds / 60))
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {round(minutes / 60)} h"


class MinuteFigures(Protocol):
    """What a stored utilization minute says (``store.read.utilization.MinuteView``)."""

    @property
    def util_mean(self) -> float | None: ...
    @property
    def memory_used_mib_max(self) -> int: ...


def last_hour_text(minutes: Sequence[MinuteFigures]) -> str:
    """A lease's last hour as a figure: the mean and peak GPU use of its minutes, or, where the
    device reports no utilization (MIG without GPM), the most memory used; or "no readings
    yet"."""
    utils = [m.util_mean for m in minutes if m.util_mean is not None]
    if utils:
        mean = sum(utils) / len(utils)
        return f"mean {mean:.0f} %, peak {max(utils):.0f} % over {plural(len(minutes), 'minute')}"
    memory = [m.memory_used_mib_max for m in minutes if m.memory_used_mib_max]
    if memory:
        most = max(memory)
        used = f"{most / 1024:.1f} GiB" if most >= 1024 else f"{most} MiB"
        return f"memory up to {used} over {plural(len(minutes), 'minute')} (no utilization)"
    return "no readings yet"
