"""One poller per server, however many tabs: the pool is asked at most once per interval and
every open lab, the widget and ``status()`` share the answer.

While at least one lab listens (its event stream is open) or something asked for the state in
the last ``idle_after`` seconds, the poller asks the pool every ``interval`` seconds for
``users/me`` and the lease's new utilization samples (two requests), and for ``offers`` every
``offers_interval`` seconds: at the defaults (5 s, 60 s) that is 0.42 requests a second per
*server*, whatever the number of tabs. With nobody looking it asks nothing. When the pool does
not answer, the wait doubles up to ``max_backoff`` and the labs are told; the first answer
after that brings the normal interval back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from . import snapshot as views
from .localgpu import LocalGPU
from .pool import LabPoolClient, PoolDown, PoolError


class Fanout:
    """The shared state of this server's GPU, refreshed by one background loop."""

    def __init__(
        self,
        client: LabPoolClient | None,
        *,
        lease_id: str,
        server: str,
        interval: float = 5.0,
        offers_interval: float = 60.0,
        max_backoff: float = 60.0,
        idle_after: float = 30.0,
        window: float = 900.0,
        local: LocalGPU | None = None,
        clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
        why_no_pool: str = "",
        page_url: str = "",
    ) -> None:
        self.client = client
        self.lease_id = lease_id
        self.server = server
        self.interval = interval
        self.offers_interval = offers_interval
        self.max_backoff = max_backoff
        self.idle_after = idle_after
        self.window = window
        self.local = local
        self.clock = clock
        self.log = log or logging.getLogger(__name__)
        self.why_no_pool = why_no_pool
        #: the pool's user page as the browser reaches it (the lab asks it once we are gone)
        self.page_url = page_url
        self.listeners: dict[str, asyncio.Queue[tuple[str, Any]]] = {}
        self.version = 0
        self.refreshes = 0
        self.state: dict[str, Any] = {}
        self._me: dict[str, Any] | None = None
        self._offers: list[dict[str, Any]] = []
        self._offers_at = -1e18
        self._samples: deque[dict[str, Any]] = deque()
        self._local_samples: deque[dict[str, Any]] = deque()
        self._series_lease: str | None = None
        self._error: PoolError | None = None
        self._down_since: float | None = None
        self._delay = interval
        self._fetched_at = -1e18
        self._demand_at = -1e18
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.last_save: dict[str, Any] | None = None
        self.state = self._build()

    # -- listeners ------------------------------------------------------------------------------

    def subscribe(self, client_id: str) -> asyncio.Queue[tuple[str, Any]]:
        """A lab's event stream: it gets the current state at once, then every new one."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=32)
        self.listeners[client_id] = queue
        queue.put_nowait(("state", self.state))
        self._wake.set()
        return queue

    def unsubscribe(self, client_id: str) -> None:
        self.listeners.pop(client_id, None)

    def publish(self, event: str, data: Any, only: str | None = None) -> None:
        """Send ``event`` to every lab (or the one ``only``); a lab too slow to read 32 events
        loses the oldest (the state is sent whole each time, so it catches up)."""
        for cid, queue in list(self.listeners.items()):
            if only is not None and cid != only:
                continue
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait((event, data))

    # -- the loop -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def wanted(self) -> bool:
        """Whether anyone looks: an open lab, or a state request within ``idle_after``."""
        return bool(self.listeners) or self.clock() - self._demand_at < self.idle_after

    async def _run(self) -> None:
        while True:
            if self.wanted() and self.clock() - self._fetched_at >= self._delay * 0.999:
                await self.refresh()
            wait = self._delay - (self.clock() - self._fetched_at)
            if not self.wanted():
                wait = 3600.0  # asleep until a lab connects or someone asks
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.05, wait))

    async def current(self) -> dict[str, Any]:
        """The state, refreshed first if it is older than the interval (shared with the loop:
        concurrent callers wait on the same refresh)."""
        self._demand_at = self.clock()
        if self.clock() - self._fetched_at >= self._delay:
            await self.refresh()
        self._wake.set()
        return self.state

    async def refresh(self, *, offers: bool = False) -> dict[str, Any]:
        """Ask the pool now (one refresh at a time; a caller arriving during one waits for
        it instead of asking again)."""
        started = self._fetched_at
        async with self._lock:
            if self._fetched_at != started and not offers:
                return self.state  # someone refreshed while we waited
            await self._fetch(force_offers=offers)
            self._fetched_at = self.clock()
            self.refreshes += 1
            self.state = self._build()
            self.publish("state", self.state)
            return self.state

    async def _fetch(self, force_offers: bool) -> None:
        if self.client is None:
            self._error = PoolDown(self.why_no_pool or "this server has no GPU pool address")
            return
        try:
            me = await self.client.me()
            now = self.clock()
            if force_offers or now - self._offers_at >= self.offers_interval:
                self._offers = await self.client.offers()
                self._offers_at = now
            current, _, _ = views.pick_lease(me.get("leases") or [], self.lease_id, self.server)
            if current is not None:
                await self._fetch_samples(current["id"])
            else:
                self._samples.clear()
            self._me = me
            if self._error is not None:
                self.log.info("The GPU pool answers again")
            self._error, self._down_since, self._delay = None, None, self.interval
        except PoolError as e:
            if self._error is None:
                self.log.warning("The GPU pool did not answer: %s", e.message)
                self._down_since = self.clock()
            self._error = e
            self._delay = min(self.max_backoff, max(self.interval, self._delay) * 2)
        self._read_local()

    async def _fetch_samples(self, lease_id: str) -> None:
        assert self.client is not None
        if self._series_lease != lease_id:
            self._samples.clear()
            self._series_lease = lease_id
        since = self._samples[-1]["ts"] if self._samples else self.clock() - self.window
        answer = await self.client.utilization(lease_id, str(since))
        by_ts: dict[float, list[dict[str, Any]]] = {}
        for s in answer.get("samples") or []:
            if s.get("ts") is not None and s["ts"] > since:
                by_ts.setdefault(float(s["ts"]), []).append(s)
        for ts in sorted(by_ts):
            group = by_ts[ts]
            utils = [s["util"] for s in group if s.get("util") is not None]
            self._samples.append(
                {
                    "ts": ts,
                    "util": sum(utils) / len(utils) if utils else None,
                    "memory_used_mib": sum(int(s.get("memory_used_mib") or 0) for s in group),
                }
            )
        self._trim(self._samples)

    def _trim(self, series: deque[dict[str, Any]]) -> None:
        horizon = self.clock() - self.window
        while series and series[0]["ts"] < horizon:
            series.popleft()

    def _read_local(self) -> None:
        lease = self._lease()
        if self.local is None or lease is None:
            return
        uuids = [s.get("mig_uuid") or s.get("gpu") for s in lease.get("slots") or []]
        reading = self.local.read([u for u in uuids if u])
        self._local = reading
        devices = reading.get("devices") or []
        if devices:
            utils = [d["util"] for d in devices if d.get("util") is not None]
            self._local_samples.append(
                {
                    "ts": self.clock(),
                    "util": sum(utils) / len(utils) if utils else None,
                    "memory_used_mib": sum(d.get("memory_used_mib") or 0 for d in devices),
                    "processes": sum(d.get("processes") or 0 for d in devices),
                }
            )
            self._trim(self._local_samples)

    def _lease(self) -> dict[str, Any] | None:
        if self._me is None:
            return None
        return views.pick_lease(self._me.get("leases") or [], self.lease_id, self.server)[0]

    # -- the state ------------------------------------------------------------------------------

    def _build(self) -> dict[str, Any]:
        now = self.clock()
        me = self._me or {}
        current, pending, stale = views.pick_lease(
            me.get("leases") or [], self.lease_id, self.server
        )
        offers = {o["name"]: o for o in self._offers if "name" in o}
        quota = views.quota_view(me, datetime.fromtimestamp(now, timezone.utc)) if me else None
        lease = views.lease_view(current, offers)
        local = getattr(self, "_local", None)
        if local is None:
            local = {
                "available": bool(self.local and self.local.available),
                "reason": self.local.reason if self.local else "NVML is switched off",
                "devices": [],
            }
        if lease is not None and local.get("devices"):
            totals = [d.get("memory_total_mib") for d in local["devices"]]
            if all(totals):
                lease["memory_total_mib"] = sum(totals)
        self.version += 1
        error = self._error
        return {
            "version": self.version,
            "at": now,
            "interval": self.interval,
            "pool": {
                "ok": error is None and self._me is not None,
                "error": None if error is None else error.message,
                "code": None
                if error is None
                else (error.code or ("down" if isinstance(error, PoolDown) else "refused")),
                "down_since": self._down_since,
                "retry_in": self._delay if error is not None else None,
                "fetched_at": None if self._fetched_at < 0 else self._fetched_at,
            },
            "user": me.get("name"),
            "server": self.server,
            "lease_id": self.lease_id or None,
            "stale_lease": stale if me else False,
            "lease": lease,
            "pending": views.pending_view(pending, offers),
            "notice": (current or {}).get("reclaim"),
            "quota": quota,
            "offers": views.offer_choices(self._offers, (current or {}).get("offer"), quota or {}),
            "utilization": {
                "window": self.window,
                "pool": list(self._samples),
                "local": list(self._local_samples),
            },
            "local": local,
            "reclaims": [
                {**r, "offer_name": views.offer_name(r.get("offer"), offers)}
                for r in (me.get("reclaims") or [])
                if r.get("server", "") == self.server
            ][:5],
            "last_save": self.last_save,
            "page": self.page_url or None,
        }
