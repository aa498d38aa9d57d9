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
        grace: float = 2.0,
        stop_timeout: float = 120.0,
        start_timeout: float = 300.0,
        max_wait: float = 86400.0,
        log: logging.Logger | None = None,
        on_done: Callable[[str, str], None] | None = None,
        writer: Any = None,
    ) -> None:
        self.store, self.hub = store, hub
        #: the service's one write path (``service/writer.py``); None: write to the store here
        self.writer = writer
        self.poll, self.stop_timeout, self.start_timeout = poll, stop_timeout, start_timeout
        #: seconds between the grant and the stop: the server's answer to the move that asked
        #: for the restart gets back to the user's page first
        self.grace = grace
        self.max_wait = max_wait
        self.log = log or logging.getLogger(__name__)
        self.on_done = on_done
        self.tasks: dict[str, asyncio.Task] = {}
        #: how each restart ended: lease id → waiting | restarting | done | gone | failed: …
        self.outcomes: dict[str, str] = {}

    def request(self, lease: dict[str, Any]) -> str:
        """Start waiting for ``lease`` (idempotent: asking twice waits once)."""
        lid = lease["id"]
        task = self.tasks.get(lid)
        if task is None or task.done():
            self.outcomes[lid] = "waiting"
            self.tasks[lid] = asyncio.ensure_future(self._run(lease))
        return self.outcomes[lid]

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(BaseException):
                await task

    async def _run(self, lease: dict[str, Any]) -> None:
        lid, user, server = lease["id"], lease["user"], lease["server"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        try:
            while True:
                now = self.store.lease(lid)
                if now["state"] == "released":
                    self._end(lid, "gone")  # cancelled, denied, expired: nothing to do
                    return
                if now["state"] == "granted" and now.get("ready", True):
                    break
                if now["state"] == "active":
                    self._end(lid, "gone")  # bound already (the server restarted elsewhere)
                    return
                if loop.time() > deadline:
                    self._end(lid, "failed: the lease was not granted in time")
                    return
                await asyncio.sleep(self.poll)
            self.outcomes[lid] = "restarting"
            await asyncio.sleep(self.grace)
            self.log.info("Restarting %s/%s into lease %s (%s)", user, server, lid, now["offer"])
            # the stop releases the lease this one replaces; marked, the target stays
            await self._mark_restarting(lid)
            await self.hub.stop_server(user, server)
            if not await self.hub.wait_server(
                user, server, running=False, timeout=self.stop_timeout
            ):
                self._end(lid, f"failed: the server did not stop within {self.stop_timeout:g} s")
                return
            await self.hub.start_server(user, server, {OFFER_OPTION: now["offer"]})
            if not await self.hub.wait_server(
                user, server, running=True, timeout=self.start_timeout
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
