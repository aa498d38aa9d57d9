"""Restarting a user's server into a lease reserved for it (a resize, or a GPU for a CPU-only
server), once that lease is granted and ready: make-before-break.

Why here: the server cannot restart itself (the hub's stop ends the process that asked), and the
user's browser may be gone by the time a queued target is granted. The pool service holds the
lease and already talks to the hub; it stops the server and starts it again with
``user_options`` ``{"gpupool_offer": <offer>}`` — the reclaimer's shrink path
(``reclaim/actions.py``): the spawner finds the reserved lease (``already_allocated``) and
adopts it. Until the target is granted nothing is touched: a target that is cancelled, denied or
expires leaves the user on the current lease. A restart waits in the replica that accepted it;
if that replica stops, the grant expires unbound and the user keeps the current lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ..hubclient import HubClient, HubUnavailable
from ..pool import commands
from ..store import Store
from ..store.read.leases import LeaseView

#: The ``user_options`` key the pool's spawners read (``spawner/base.py``'s ``OPTION``).
OFFER_OPTION = "gpupool_offer"
#: Lease states a restart may wait on (an ``active`` lease already runs its server).
WAITING = ("awaiting_approval", "queued", "granted")


class Restarts:
    """The restarts this replica waits to carry out, one per target lease."""

    def __init__(
        self,
        store: Store,
        hub: HubClient,
        *,
        poll: float = 1.0,
        grace: float = 0.5,
        stop_timeout: float = 120.0,
        start_timeout: float = 300.0,
        max_wait: float = 86400.0,
        hub_poll: float = 0.2,
        log: logging.Logger | None = None,
        on_done: Callable[[str, str], None] | None = None,
        writer: Any = None,
    ) -> None:
        self.store, self.hub = store, hub
        #: the service's one write path (``service/writer.py``); None: write to the store here
        self.writer = writer
        self.poll, self.stop_timeout, self.start_timeout = poll, stop_timeout, start_timeout
        #: seconds between the grant and the stop: the server's answer to the move that asked
        #: for the restart gets back to the user's page first (it is sent right after the
        #: restart is asked for: half a second is ample, and a move should take seconds)
        self.grace = grace
        self.max_wait = max_wait
        #: seconds between asks of the hub while the server stops and starts again (a move's
        #: time is the server's start plus at most about this twice)
        self.hub_poll = hub_poll
        self.log = log or logging.getLogger(__name__)
        self.on_done = on_done
        self.tasks: dict[str, asyncio.Task[None]] = {}
        #: set (and replaced) by ``wake``: a release may have granted a waiting target
        self._wake: asyncio.Event | None = None
        #: how each restart ended: lease id → waiting | restarting | done | gone | failed: …
        self.outcomes: dict[str, str] = {}

    def request(self, lease: LeaseView) -> str:
        """Start waiting for ``lease`` (idempotent: asking twice waits once)."""
        lid = lease.id
        task = self.tasks.get(lid)
        if task is None or task.done():
            self.outcomes[lid] = "waiting"
            self.tasks[lid] = asyncio.ensure_future(self._run(lease))
        return self.outcomes[lid]

    def wake(self) -> None:
        """Something was released (the pool serves its queue then): every waiting restart
        looks at its lease now, not at its next poll, so a hand-off starts at once."""
        if self._wake is not None:
            self._wake.set()
        self._wake = asyncio.Event()

    async def _nap(self) -> None:
        """Wait for a ``wake`` or ``poll`` seconds, whichever comes first."""
        if self._wake is None:
            self._wake = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.poll)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(BaseException):
                await task

    async def _run(self, lease: LeaseView) -> None:
        lid, user, server = lease.id, lease.user, lease.server
        loop = asyncio.get_running_loop()
        asked = loop.time()
        deadline = asked + self.max_wait
        try:
            while True:
                now = self.store.lease(lid)
                if now.state == "released":
                    self._end(lid, "gone")  # cancelled, denied, expired: nothing to do
                    return
                if now.state == "granted" and now.ready:
                    break
                if now.state == "active":
                    self._end(lid, "gone")  # bound already (the server restarted elsewhere)
                    return
                if loop.time() > deadline:
                    self._end(lid, "failed: the lease was not granted in time")
                    return
                await self._nap()
            self.outcomes[lid] = "restarting"
            # the grace counts from the ask: a target granted later (a hand-off from the
            # queue) answered its page long ago and goes at once
            await asyncio.sleep(max(0.0, asked + self.grace - loop.time()))
            self.log.info("Restarting %s/%s into lease %s (%s)", user, server, lid, now.offer)
            # the stop releases the lease this one replaces; marked, the target stays
            await self._mark_restarting(lid)
            await self.hub.stop_server(user, server)
            if not await self.hub.wait_server(
                user, server, running=False, timeout=self.stop_timeout, poll=self.hub_poll
            ):
                self._end(lid, f"failed: the server did not stop within {self.stop_timeout:g} s")
                return
            await self.hub.start_server(user, server, {OFFER_OPTION: now.offer})
            if not await self.hub.wait_server(
                user, server, running=True, timeout=self.start_timeout, poll=self.hub_poll
            ):
                self._end(lid, f"failed: the server did not start within {self.start_timeout:g} s")
                return
            self._end(lid, "done")
        except asyncio.CancelledError:
            raise
        except (HubUnavailable, Exception) as e:  # the hub refused or is away: log, keep going
            self.log.error("Restarting %s/%s into lease %s failed: %s", user, server, lid, e)
            self._end(lid, f"failed: {e}"[:255])

    async def _mark_restarting(self, lid: str) -> None:
        if self.writer is not None:
            await self.writer.run(commands.MarkRestarting(lid, actor="service:gpupool"))
        else:
            self.store.mark_restarting(lid, actor="service:gpupool")

    def _end(self, lid: str, outcome: str) -> None:
        self.outcomes[lid] = outcome
        if self.on_done is not None:
            self.on_done(lid, outcome)
