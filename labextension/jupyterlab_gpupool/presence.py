"""The user's input, relayed to the pool: the only presence the reclaimer counts where this
package runs.

The pool cannot tell a person from a program: the proxy stamps every request as activity (an
open tab's polling, the reclaimer's own reads), so the hub's ``last_activity`` keeps an idle
GPU "in use" forever. The lab knows better: keyboard and pointer input in a visible tab. Each
lab reports it here at most once a minute; this relay passes at most one report a minute per
server on to the pool (``POST allocations/{id}/presence``), however many tabs are open, and
announces itself when the server starts, so that from then on the pool ignores every other
sign of presence for this lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from .pool import LabPoolClient, PoolDown, PoolError

#: The most a lab may say the input is old: it reports within a minute of the input.
MAX_IDLE_FOR = 600.0


class PresenceRelay:
    """Throttles the labs' input reports to one per ``min_interval`` and sends them on."""

    def __init__(
        self,
        client: LabPoolClient | None,
        lease_id: str,
        *,
        min_interval: float = 60.0,
        retry_max: float = 60.0,
        clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
    ) -> None:
        self.client = client
        self.lease_id = lease_id
        self.min_interval = min_interval
        self.retry_max = retry_max
        self.clock = clock
        self.log = log or logging.getLogger(__name__)
        self.sent = 0
        self.announced = False
        self._last_sent = -1e18
        self._input_at: float | None = None  # the newest input not yet sent
        self._flush: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        """Only a server on a lease, with a way to the pool, reports."""
        return self.client is not None and bool(self.lease_id)

    def start(self) -> None:
        """Announce this lab to the pool in the background (retried while the pool is away)."""
        if self.enabled and self._task is None:
            self._task = asyncio.ensure_future(self._announce())

    async def stop(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _announce(self) -> None:
        delay = 2.0
        while not self.announced:
            try:
                await self._send(None)
                return
            except PoolDown as e:
                self.log.info("Presence: the pool is away (%s); retrying in %gs", e, delay)
            except PoolError as e:
                self.log.warning("Presence: the pool refused this lab's announcement: %s", e)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max)

    def report(self, idle_for: float) -> float:
        """A lab saw input ``idle_for`` seconds ago: sent now, or at the end of the current
        minute with the newest input by then. Returns the seconds until it goes out."""
        if not self.enabled:
            return -1.0
        now = self.clock()
        at = now - min(max(idle_for, 0.0), MAX_IDLE_FOR)
        self._input_at = at if self._input_at is None else max(self._input_at, at)
        wait = self._last_sent + self.min_interval - now
        if wait <= 0:
            self._go()
            return 0.0
        if self._flush is None:
            self._flush = asyncio.get_event_loop().call_later(wait, self._go)
        return wait

    def _go(self) -> None:
        self._flush = None
        if self._input_at is None:
            return
        idle_for = max(0.0, self.clock() - self._input_at)
        self._input_at = None
        self._last_sent = self.clock()
        task = asyncio.ensure_future(self._send_quietly(idle_for))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_quietly(self, idle_for: float) -> None:
        try:
            await self._send(idle_for)
        except PoolError as e:  # the next input's report tries again
            self.log.info("Presence: report not delivered (%s)", e)

    async def _send(self, idle_for: float | None) -> dict[str, Any]:
        assert self.client is not None
        answer = await self.client.presence(self.lease_id, idle_for)
        self.announced = True
        self.sent += 1
        return answer
