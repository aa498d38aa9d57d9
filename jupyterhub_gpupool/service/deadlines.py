"""Admin and drain notices carried out by the pool service when no reclaimer did.

A drain by a deadline, or an admin's "reclaim now" with notice, is the reclaimer's to carry out
at the deadline: it asks the lab to save everything, then stops the server. With no reclaimer
running nothing would happen, and a node drained for maintenance would keep its leases. So the
leader's housekeeping claims the notices overdue by more than ``notice_enforce_after`` seconds
(long enough for a running reclaimer's rounds to claim them first), stops each server through
the hub (the pool's token has the ``servers`` scope) and reports back: the lease is released
with reason ``admin`` (``lapsed`` for an approved exception's time running out, as the
reclaimer would) and the audit log says who and why. Idle notices stay the reclaimer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..hubclient import HubClient
from ..pool import commands
from ..pool.commands import Command
from ..store import Store
from ..store.read.reclaim import EnforcedNoticeView
from ..timeparse import format_time


class NoticeDeadlines:
    """Stops the servers of overdue admin and drain notices; ``step`` from housekeeping."""

    def __init__(
        self,
        store: Store,
        hub: HubClient,
        call: Callable[[Command], Awaitable[Any]],
        *,
        after: float,
        actor: str,
        stop_timeout: float = 120.0,
        log: logging.Logger | None = None,
    ) -> None:
        self.store, self.hub, self.call = store, hub, call
        #: seconds past a deadline before the service acts (negative: never)
        self.after = after
        self.actor = actor
        self.stop_timeout = stop_timeout
        self.log = log or logging.getLogger(__name__)
        self.tasks: set[asyncio.Task[None]] = set()

    async def step(self) -> int:
        """Claim what is overdue and start stopping those servers (in the background: a slow
        stop must not hold up the rest of housekeeping); how many were claimed."""
        if self.after < 0:
            return 0
        claimed = await self.call(commands.EnforceNotices(self.after, actor=self.actor))
        for lease in claimed:
            task = asyncio.ensure_future(self._carry_out(lease))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return len(claimed)

    async def _carry_out(self, lease: EnforcedNoticeView) -> None:
        lid, user, server = lease.lease, lease.user, lease.server
        self.log.warning(
            "The %s notice of lease %s (%s/%s) passed its deadline %s with no reclaimer acting:"
            " stopping the server",
            lease.kind,
            lid,
            user,
            server,
            format_time(lease.deadline),
        )
        detail = ""
        try:
            await self.hub.stop_server(user, server)
            stopped = await self.hub.wait_server(
                user, server, running=False, timeout=self.stop_timeout
            )
            if not stopped:
                detail = f"the server did not stop within {self.stop_timeout:g} s"
        except Exception as e:  # the hub refused or is away: the claim stays, tried again later
            stopped, detail = False, f"stopping the server failed: {e}"[:500]
        if not stopped:
            self.log.error("Lease %s: %s", lid, detail)
        try:
            await self.call(commands.NoticeEnforced(lid, stopped, detail, actor=self.actor))
        except Exception:
            self.log.exception("Recording the end of lease %s's notice failed", lid)

    async def close(self) -> None:
        """Give up the stops under way (on shutdown): their claims stay, and are handed out
        again once older than ``reclaim_claim_timeout``."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
