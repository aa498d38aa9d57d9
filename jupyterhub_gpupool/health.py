"""``GET .../health``: whether a process can do its work, for Kubernetes' probes.

An open port is not health: a pool service whose writer is wedged (a transaction stuck on a
lock, a hung store process) keeps answering TCP and even reads while every grant waits forever,
and a reclaimer whose round hangs on a server that never stops reclaims nothing. So the answer
looks at what does the work: the event loop (a stuck loop never answers at all, and a late one
says how late it was) and the part's own work (the writer's owed answers, the reclaimer's
round), each stalled for no longer than ``stall_after``. No authentication, and nothing in the
body but these figures: probes carry no token. A database that is away is not ill health (the
API answers 503 ``store_unavailable`` meanwhile, and a restart would not bring it back).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from tornado import web

#: Seconds between the loop's heartbeats.
BEAT = 1.0


class LoopWatch:
    """How late the event loop ran a callback scheduled for a known time: a loop blocked by
    long synchronous work runs it late by that much."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lag = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start beating on the running loop."""
        self._schedule(asyncio.get_running_loop())

    def stop(self) -> None:
        """Stop beating."""
        if self._handle is not None:
            self._handle.cancel()

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self.clock() + BEAT
        self._handle = loop.call_later(BEAT, self._beat, loop, due)

    def _beat(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self.lag = max(0.0, self.clock() - due)
        self._schedule(loop)


def health(
    work: str, stalled: float, loop_lag: float, stall_after: float, **figures: Any
) -> tuple[bool, dict[str, Any]]:
    """Whether the process is healthy, and the body that says why: ``work`` names the part's
    own work (``writer``, ``round``), stalled for ``stalled`` seconds, with more ``figures``."""
    work_ok = stalled <= stall_after
    loop_ok = loop_lag <= stall_after
    return work_ok and loop_ok, {
        "status": "ok" if work_ok and loop_ok else "unhealthy",
        "loop": {"ok": loop_ok, "lag_seconds": round(loop_lag, 3)},
        work: {"ok": work_ok, **figures, "stalled_seconds": round(stalled, 3)},
        "stall_after_seconds": stall_after,
    }


class HealthHandler(web.RequestHandler):
    """200 when healthy, 503 otherwise; the body says which part is not. The application's
    ``health`` setting computes the answer."""

    def get(self) -> None:
        ok, body = self.settings["health"]()
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def compute_etag(self) -> None:
        return None

    def head(self) -> None:
        self.get()
