"""The reclaimer's one async core: a round sees, the pool decides, the reclaimer acts.

A round (:meth:`Reclaimer.run_once`):

1. takes or renews the pool's leader lock (``POST reclaim/leader``): not the leader, nothing
   more this round (two replicas never act twice);
2. reads the watched leases (``GET reclaim/leases``, paged) and the hub's active users
   (``GET /users?state=active``, paged like jupyterhub-idle-culler pages it);
3. reads each leased server's kernels and lab connections through the proxy, at most
   ``concurrency`` requests at once;
4. posts the window's observations (``POST reclaim/rounds``) and gets the pool's decisions;
5. calls ``notify_hook`` at each notice, cancellation and action, carries out every ``act``
   (save, then stop / restart without a GPU / restart on a smaller offer) and reports the
   outcome.

The hub or the pool unreachable: nothing is observed, posted or acted on, and the next round
comes later and later (exponential backoff, capped). Time comes from ``clock`` and the pause
between rounds from ``sleep``, both injectable, so tests move time instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tornado.httpclient import HTTPClientError

from ..hubclient import HubClient, HubUnavailable, ServerUnavailable
from ..poolclient import PoolClient, PoolClientError, PoolRefused
from ..timeparse import parse_time
from . import actions
from .metrics import ReclaimerMetrics

#: ``notify_hook(event, lease, decision)``: ``event`` is one of :data:`EVENTS`.
NotifyHook = Callable[[str, dict[str, Any], dict[str, Any]], Any]
#: ``notice``/``cancel``/``act`` as the pool decided; ``done``/``failed`` once an act finished
#: (the decision then carries ``outcome``: ``{"result", "saved", "detail"}``).
EVENTS = ("notice", "cancel", "act", "done", "failed")
#: Kernel ``execution_state`` values that mean something runs (``starting`` is a kernel nobody
#: has connected to yet: it runs nothing).
_WORKING = {"busy", "restarting", "autorestarting"}


def default_holder() -> str:
    """This replica's name in the leader lock: host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def kernel_state(kernels: object) -> tuple[str, float | None]:
    """``busy``/``idle``/``unknown`` and the newest ``last_activity`` of ``GET /api/kernels``.

    Any kernel busy (or restarting) is busy; no kernels, or every kernel idle, starting or
    dead, is idle; anything else (a list we cannot read) is unknown, which is never idle.
    """
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        return "unknown", None
    states = {k.get("execution_state") for k in kernels}
    stamps = [
        t.timestamp()
        for k in kernels
        if (t := parse_time(k.get("last_activity"), lenient=True)) is not None
    ]
    last = max(stamps, default=None)
    if states & _WORKING:
        return "busy", last
    if states <= {"idle", "starting", "dead"}:
        return "idle", last
    return "unknown", last


@dataclass
class RoundResult:
    """What one round did (logged, counted, and read by tests)."""

    result: str  # ok | not_leader | hub_error | pool_error
    window: tuple[float, float] | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    outcomes: dict[str, actions.Outcome] = field(default_factory=dict)
    error: str = ""


class Reclaimer:
    """The eyes and hands of reclamation (the pool decides). See the module's docstring."""

    def __init__(
        self,
        pool: PoolClient,
        hub: HubClient,
        *,
        holder: str | None = None,
        interval: float = 30.0,
        leader_ttl: float = 180.0,
        concurrency: int = 10,
        backoff_max: float = 900.0,
        page_size: int = 200,
        notify_hook: NotifyHook | None = None,
        hook_timeout: float = 30.0,
        require_save: bool = True,
        server_timeout: float = 10.0,
        stop_timeout: float = 300.0,
        start_timeout: float = 300.0,
        shrink_timeout: float = 600.0,
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        metrics: ReclaimerMetrics | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.pool, self.hub = pool, hub
        self.holder = holder or default_holder()
        self.interval, self.leader_ttl = interval, leader_ttl
        self.concurrency, self.backoff_max, self.page_size = concurrency, backoff_max, page_size
        self.notify_hook, self.hook_timeout = notify_hook, hook_timeout
        self.require_save, self.server_timeout = require_save, server_timeout
        self.stop_timeout, self.start_timeout = stop_timeout, start_timeout
        self.shrink_timeout, self.poll_interval = shrink_timeout, poll_interval
        self.clock, self.sleep = clock, sleep
        self.metrics = metrics or ReclaimerMetrics()
        self.log = log or logging.getLogger(__name__)
        #: rounds failed in a row (hub or pool away): the backoff's exponent
        self.failures = 0
        #: ``time.monotonic()`` when the round under way began (None between rounds): the
        #: health check's view of a round that hangs
        self.round_started: float | None = None
        #: the most server requests in flight at once (bounded by ``concurrency``)
        self.peak_in_flight = 0
        self._in_flight = 0
        self._last_end: float | None = None
        self._leading = False
        self._refused: set[str] = set()  # servers whose refusal was logged already

    # -- the loop ----------------------------------------------------------------------------

    def next_delay(self) -> float:
        """Seconds until the next round: ``interval``, doubled for each failed round in a row,
        at most ``backoff_max`` (never below ``interval``)."""
        if not self.failures:
            return self.interval
        cap = max(self.interval, self.backoff_max)
        return min(cap, self.interval * 2.0 ** min(self.failures, 32))

    async def run(self, stop: asyncio.Event | None = None, rounds: int | None = None) -> None:
        """Run rounds until ``stop`` is set (or ``rounds`` rounds ran), then give up the lead."""
        done = 0
        try:
            while stop is None or not stop.is_set():
                try:
                    await self.run_once()
                except Exception:  # a bug must not end the loop (the next round may work)
                    self.log.exception("Reclaim round failed")
                    self.failures += 1
                done += 1
                if rounds is not None and done >= rounds:
                    break
                delay = self.next_delay()
                self.metrics.backoff.set(delay)
                await self.sleep(delay)
        finally:
            await self.close()

    async def close(self) -> None:
        """Give up the lead, so another replica takes over at once."""
        if not self._leading:
            return
        self._leading = False
        self.metrics.leader.set(0)
        with contextlib.suppress(PoolClientError):
            await self.pool.give_up_reclaim_lead(self.holder)

    # -- one round ---------------------------------------------------------------------------

    async def run_once(self) -> RoundResult:
        """One round: lead, see, post, act. Never raises for the hub or the pool being away."""
        started = self.round_started = time.monotonic()
        try:
            result = await self._round()
        finally:
            self.round_started = None
            self.metrics.duration.observe(time.monotonic() - started)
        self.metrics.rounds.labels(result=result.result).inc()
        return result

    async def _round(self) -> RoundResult:
        try:
            if not await self._lead():
                return RoundResult("not_leader")
            leases = await self.pool.reclaim_leases(self.page_size)
        except PoolClientError as e:
            return self._failed("pool", e)
        try:
            users = await self.hub.users(state="active")
        except (HubUnavailable, HTTPClientError, OSError) as e:
            return self._failed("hub", e)
        end = self.clock()
        start = self._last_end
        if start is None or not 0 < end - start <= 4 * self.interval:
            start = end - self.interval  # the first round, or after a long pause
        window = (start, end)
        servers = {
            (u["name"], name): s for u in users for name, s in (u.get("servers") or {}).items()
        }
        observed = await self.observe(leases, servers)
        try:
            answer = await self.pool.reclaim_round(self.holder, window, observed)
        except PoolRefused as e:
            if e.code == "not_leader":
                self._lost_lead(e)
                return RoundResult("not_leader", window, observed)
            return self._failed("pool", e)
        except PoolClientError as e:
            return self._failed("pool", e)
        self.failures = 0
        self._last_end = end
        decisions = list(answer.get("decisions") or [])
        result = RoundResult("ok", window, observed, decisions)
        by_id = {lease["id"]: lease for lease in leases}
        kinds = Counter(d.get("kind", "") for d in decisions)
        for kind, n in kinds.items():
            self.metrics.decisions.labels(kind=kind).inc(n)
        stale = int(answer.get("stale") or 0)
        if stale:
            self.metrics.stale.inc(stale)
            self.metrics.stale_rounds.inc()
        self._log_round(leases, observed, kinds)
        for d in decisions:
            if d.get("kind") in ("notice", "cancel"):
                self._log_decision(d)
                await self.notify(d["kind"], by_id.get(d["lease"], {}), d)
        acts = [d for d in decisions if d.get("kind") == "act"]
        if acts:
            result.outcomes = await self._act_all(acts, by_id, servers)
        return result

    async def _lead(self) -> bool:
        """Take or renew the lead; False (logged, not an error) when another replica has it."""
        try:
            await self.pool.take_reclaim_lead(self.holder, self.leader_ttl)
        except PoolRefused as e:
            if e.code != "not_leader":
                raise
            self._lost_lead(e)
            return False
        if not self._leading:
            self.log.info("Reclaimer %s leads: it observes and acts", self.holder)
        self._leading = True
        self.metrics.leader.set(1)
        return True

    def _lost_lead(self, e: PoolClientError) -> None:
        self.failures = 0  # not a failure: another replica does the work
        self._leading = False
        self.metrics.leader.set(0)
        self.log.info("Not the leader this round (%s): observing and acting on nothing", e)

    def _failed(self, target: str, e: BaseException) -> RoundResult:
        self.failures += 1
        self.metrics.errors.labels(target=target).inc()
        code = getattr(e, "code", None) if target == "hub" else getattr(e, "status", None)
        what = (
            "refuses the reclaimer's token (check its role)"
            if code in (401, 403)
            else ("is unreachable")
        )
        self.log.warning(
            "%s %s (%s): observing and acting on nothing; next round in %gs",
            "The hub" if target == "hub" else "The pool service",
            what,
            e,
            self.next_delay(),
        )
        return RoundResult(f"{target}_error", error=str(e))

    # -- observing ---------------------------------------------------------------------------

    async def observe(
        self,
        leases: Iterable[Mapping[str, Any]],
        servers: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> dict[str, Any]:
        """The ``observed`` of a round: each leased server's kernels and open connections.

        A server is read at the address its spawner gave the pool (``server_url``), not through
        the proxy, which would stamp the reads as the user's activity; ``last_input`` is left
        null: the hub's ``last_activity`` is not input (the proxy stamps every request, an open
        tab's polling too), and where the lab package runs, the pool has the lab's reports.
        A lease whose server the hub does not run (or which is starting or stopping) is left
        out, as is the kernel of a server that could not be reached: the pool reads a missing
        observation as stale and decides nothing on it.
        """
        semaphore = asyncio.Semaphore(self.concurrency)
        now = self.clock()

        async def one(lease: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
            model = servers.get((lease["user"], lease.get("server") or ""))
            if model is None or not model.get("ready") or model.get("pending"):
                return lease["id"], None
            where = lease.get("server_url") or model["url"]
            kernel, connections = await self._read_server(where, semaphore)
            presence = {"last_input": None, "connections": connections, "observed_at": now}
            return lease["id"], {"kernel": kernel, "presence": presence}

        seen = await asyncio.gather(*(one(lease) for lease in leases))
        return {lease: obs for lease, obs in seen if obs is not None}

    async def _call(self, semaphore: asyncio.Semaphore, url: str, path: str) -> tuple[int, Any]:
        async with semaphore:
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            try:
                return await self.hub.call_server(url, path, timeout=self.server_timeout)
            finally:
                self._in_flight -= 1

    async def _read_server(
        self, url: str, semaphore: asyncio.Semaphore
    ) -> tuple[dict[str, Any] | None, int]:
        """The kernel observation (None: unreachable) and the open connections of a server."""
        try:
            status, kernels = await self._call(semaphore, url, "api/kernels?no_track_activity=1")
        except ServerUnavailable as e:
            self.metrics.errors.labels(target="server").inc()
            self.log.info("Server %s unreachable (%s): no kernel observation", url, e)
            return None, 0
        observed_at = self.clock()
        if status in (401, 403):
            if url not in self._refused:
                self._refused.add(url)
                self.log.warning(
                    "Server %s refuses the reclaimer's token (%d): its kernels count as "
                    "unknown, never idle (does the token hold access:servers?)",
                    url,
                    status,
                )
            return {"state": "unknown", "last_activity": None, "observed_at": observed_at}, 0
        state, last = kernel_state(kernels) if status == 200 else ("unknown", None)
        kernel = {"state": state, "last_activity": last, "observed_at": observed_at}
        connections = 0
        try:
            status, info = await self._call(semaphore, url, "api/status")
            if status == 200 and isinstance(info, dict):
                connections = int(info.get("connections") or 0)
        except (ServerUnavailable, ValueError, TypeError):
            pass
        return kernel, connections

    # -- acting ------------------------------------------------------------------------------

    async def _act_all(
        self,
        acts: list[dict[str, Any]],
        leases: Mapping[str, dict[str, Any]],
        servers: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> dict[str, actions.Outcome]:
        """Carry out every act (at most ``concurrency`` at once), keeping the lead meanwhile
        so the outcomes are accepted however long the actions take."""
        semaphore = asyncio.Semaphore(self.concurrency)
        keeper = asyncio.ensure_future(self._keep_lead())

        async def one(d: dict[str, Any]) -> tuple[str, actions.Outcome]:
            async with semaphore:
                lease = leases.get(d["lease"], {})
                model = servers.get((d["user"], d.get("server") or ""))
                if model is not None and lease.get("server_url"):
                    model = {**model, "url": lease["server_url"]}  # save without the proxy
                return d["lease"], await self.act(d, lease, model)

        try:
            return dict(await asyncio.gather(*(one(d) for d in acts)))
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _keep_lead(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.leader_ttl / 3))
            with contextlib.suppress(PoolClientError):
                await self.pool.take_reclaim_lead(self.holder, self.leader_ttl)

    async def act(
        self,
        decision: dict[str, Any],
        lease: dict[str, Any],
        server: Mapping[str, Any] | None,
    ) -> actions.Outcome:
        """Carry out one ``act`` decision and report its outcome to the pool."""
        self._log_decision(decision)
        await self.notify("act", lease, decision)
        outcome = await self._carry_out(decision, server)
        action = decision.get("action", "")
        self.metrics.acts.labels(action=action.partition(":")[0], outcome=outcome.result).inc()
        level = logging.INFO if outcome.result == "done" else logging.WARNING
        self.log.log(
            level,
            "Reclaim of %s/%s (lease %s, %s): %s%s; saved %s",
            decision.get("user"),
            decision.get("server") or "(default)",
            decision["lease"],
            action,
            outcome.result,
            f" ({outcome.detail})" if outcome.detail else "",
            ", ".join(outcome.saved) or "nothing",
        )
        try:
            await self.pool.reclaim_outcome(
                decision["lease"], self.holder, outcome.result, outcome.saved, outcome.detail
            )
        except PoolClientError as e:
            self.metrics.errors.labels(target="pool").inc()
            self.log.error(
                "The outcome of lease %s could not be reported (%s); the pool hands the action "
                "out again after its claim timeout",
                decision["lease"],
                e,
            )
        done = {"result": outcome.result, "saved": outcome.saved, "detail": outcome.detail}
        report = {**decision, "outcome": done}
        await self.notify(outcome.result, lease, report)
        return outcome

    async def _carry_out(
        self, decision: dict[str, Any], server: Mapping[str, Any] | None
    ) -> actions.Outcome:
        user, name = decision["user"], decision.get("server") or ""
        action = decision.get("action") or "stop"
        verb, _, offer = action.partition(":")
        saved: list[str] = []
        try:
            if verb == "shrink":
                if not decision.get("target_lease"):
                    raise actions.ActionFailed("the pool reserved no target lease for the shrink")
                await actions.wait_target(
                    self.pool, decision["target_lease"], self.shrink_timeout, self.poll_interval
                )
            elif verb not in ("stop", "release-gpu"):
                raise actions.ActionFailed(f"unknown action {action!r}")
            if server is not None:
                try:
                    saved = await actions.save_all(self.hub, server["url"], self.server_timeout)
                except actions.ActionFailed as e:
                    if self.require_save:
                        raise
                    self.log.warning("Saving before %s failed (%s): acting anyway", action, e)
            await actions.stop(self.hub, user, name, self.stop_timeout)
            if verb != "stop":
                options = {actions.OFFER_OPTION: offer if verb == "shrink" else ""}
                await actions.start(self.hub, user, name, options, self.start_timeout)
        except actions.ActionFailed as e:
            if e.irreversible:  # the GPU is back in the pool; the restart is what failed
                return actions.Outcome("done", saved, str(e))
            return actions.Outcome("failed", saved, f"{e}; the user keeps the GPU")
        return actions.Outcome("done", saved)

    # -- the hook and the log ----------------------------------------------------------------

    async def notify(self, event: str, lease: dict[str, Any], decision: dict[str, Any]) -> None:
        """Call ``notify_hook`` (sync or async, at most ``hook_timeout`` s); what it raises is
        logged and counted, never passed on: a broken mail relay must not stop reclaims."""
        hook = self.notify_hook
        if hook is None:
            return
        try:
            returned = hook(event, lease, decision)
            if inspect.isawaitable(returned):
                await asyncio.wait_for(returned, self.hook_timeout)
        except Exception:
            self.metrics.hook_errors.inc()
            self.log.exception("notify_hook failed on %s of lease %s", event, decision.get("lease"))

    def _log_round(
        self,
        leases: list[dict[str, Any]],
        observed: Mapping[str, Any],
        kinds: Mapping[str, int],
    ) -> None:
        unknown = sum(
            1 for o in observed.values() if (o.get("kernel") or {}).get("state") == "unknown"
        )
        summary = " ".join(f"{k}={n}" for k, n in sorted(kinds.items())) or "none"
        level = logging.INFO if kinds.get("notice") or kinds.get("act") else logging.DEBUG
        if kinds.get("stale"):
            level = logging.INFO
        self.log.log(
            level,
            "Round: %d leases, %d observed (%d kernels unknown); decisions: %s",
            len(leases),
            len(observed),
            unknown,
            summary,
        )

    def _log_decision(self, d: Mapping[str, Any]) -> None:
        self.log.info(
            "%s %s/%s (lease %s, %s): %s",
            d.get("kind", "").capitalize(),
            d.get("user"),
            d.get("server") or "(default)",
            d.get("lease"),
            d.get("action") or d.get("offer"),
            d.get("reason", ""),
        )
