"""What every GPU pool spawner shares: ask the pool, wait in its queue, pin, give back.

The mixin goes *before* a concrete spawner class (``class S(GPUPoolSpawnerMixin,
LocalProcessSpawner)``). The lease is requested in ``run_pre_spawn_hook`` — after JupyterHub
applied the user's options and group overrides, and *outside* ``start_timeout`` (the hub wraps
only ``start()`` in it), so a long queue has its own limit, :attr:`queue_timeout`. While the
request waits, :meth:`progress` streams its queue position; then the concrete spawner starts the
server pinned to the granted devices, and the lease is bound (``keepalive``). The lease id lives
in the spawner state (versioned) so a hub restart keeps running servers' leases; it is given
back when the server stops, when ``poll()`` finds it gone, and in any failed spawn. Only a
release forgets the lease: ``clear_state()`` (which ``poll()`` calls when the process died)
must not lose it before it is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, cast

from jupyterhub.spawner import Spawner
from jupyterhub.utils import maybe_future
from tornado import web
from tornado.ioloop import IOLoop
from traitlets import Bool, Float, List, Unicode, default
from traitlets.config import Configurable

from jupyterhub_gpupool.logquiet import EXPECTED, quiet_expected_refusals
from jupyterhub_gpupool.pool.codes import describe
from jupyterhub_gpupool.pool.leases import still_waiting
from jupyterhub_gpupool.poolclient import PoolClient, PoolRefused, PoolUnavailable
from jupyterhub_gpupool.wording import asked_ago, ordinal

from .address import internal_url
from .picker import DURATION_OPTION, OPTION, REASON_OPTION, annotate, render, wait_text

#: key of this mixin's part of the spawner state, and its version
STATE_KEY = "gpupool"
STATE_VERSION = 1


def spawn_error(message: str, *, reason: str, status: int = 400, html: str = "") -> Exception:
    """The exception that ends a spawn with ``message`` shown to the user, no traceback.

    ``SpawnException`` on JupyterHub 6; on 5.x an ``HTTPError`` carrying ``jupyterhub_message``,
    which the progress page shows the same way.
    """
    try:
        from jupyterhub.spawner import SpawnException
    except ImportError:  # JupyterHub 5
        err: Exception = web.HTTPError(status, "%s", message)
        err.jupyterhub_message = message  # type: ignore[attr-defined]  # the spawn page reads it
        if html:
            err.jupyterhub_html_message = html  # type: ignore[attr-defined]  # the spawn page reads it
        return err
    err = SpawnException(message, reason=reason, status_code=status, message_html=html)
    # the spawn page shows jupyterhub_message when set, else str(err) with status and reason
    err.jupyterhub_message = message  # type: ignore[attr-defined]  # the spawn page reads it
    if html:
        err.jupyterhub_html_message = html  # type: ignore[attr-defined]  # the spawn page reads it
    return err


class GPUPoolSpawnerMixin(Configurable):
    """Pool-aware spawning; combine with a concrete Spawner (see ``local.py``, ``kube.py``)."""

    pool_service_name = Unicode(
        "gpupool",
        help="Name of the pool's JupyterHub service; used to find the pool's URL when "
        "pool_api_url is not set.",
    ).tag(config=True)

    pool_api_url = Unicode(
        "",
        help="Base URL of the pool's REST API v1 as the hub reaches it, e.g. "
        "http://127.0.0.1:10101/services/gpupool/api/v1/. Empty: the URL of the hub service "
        "named pool_service_name plus its prefix and api/v1/.",
    ).tag(config=True)

    pool_api_token = Unicode(
        help="Hub API token of the service the spawner acts as; it needs the scope "
        "custom:gpupool:spawn. Default: $GPUPOOL_SPAWNER_TOKEN.",
    ).tag(config=True)

    @default("pool_api_token")
    def _default_token(self) -> str:
        return os.environ.get("GPUPOOL_SPAWNER_TOKEN", "")

    server_pool_api_url = Unicode(
        "",
        help="The pool API URL as the single-user server reaches it (GPUPOOL_API_URL in its "
        "environment). Empty: the same as pool_api_url.",
    ).tag(config=True)

    pool_clusters = List(
        Unicode(),
        help="The pool's clusters this hub can launch servers into (DNS labels the pool "
        "config's `clusters` lists). The pool grants only on nodes there, and the picker shows "
        "only offers those clusters serve, counted there. Empty: every cluster (one hub, one "
        "pool).",
    ).tag(config=True)

    pool_offers = List(
        Unicode(),
        help="Offers this spawner shows, in this order. Empty: every offer the pool lets the "
        "user use. A request for any other offer is refused, whatever the form sent.",
    ).tag(config=True)

    allow_cpu_only = Bool(
        True,
        help="Offer a 'No GPU' choice. When False, every server must hold a GPU lease.",
    ).tag(config=True)

    allow_offer_from_query = Bool(
        False,
        help="Let a GET of /hub/spawn with query arguments (?gpupool_offer=... or "
        "?opt-gpupool_offer=..., and /hub/spawn/<user>/<server>?...) start a server with a "
        "GPU. JupyterHub starts a server straight from such a link, which any web page can "
        "make a logged-in user's browser follow, so by default a query spawn that would take a "
        "GPU is refused with a message on the spawn page and the GPU is chosen in the form "
        "(a POST JupyterHub protects against cross-site requests). Spawns through the REST "
        "API are not affected.",
    ).tag(config=True)

    default_offer = Unicode(
        "",
        help="Offer used when a spawn names none (API spawns without options) and the one "
        "preselected in the picker. Empty: no GPU if allow_cpu_only, else the first offer.",
    ).tag(config=True)

    queue_timeout = Float(
        3600.0,
        help="Seconds a spawn may wait in the pool's queue before it gives up. Separate from "
        "start_timeout, which counts only the server start after the GPU is granted.",
    ).tag(config=True)

    approval_wait = Float(
        900.0,
        help="Seconds a spawn shows 'waiting for approval' before it ends; the request stays "
        "with the administrators (the pool's notify_hook tells the user of the decision), and "
        "the next start of the server picks it up, approved or still waiting.",
    ).tag(config=True)

    queue_poll_interval = Float(
        2.0, help="Seconds between checks of a queued request (and progress updates)."
    ).tag(config=True)

    pool_request_timeout = Float(
        10.0, help="Seconds before one call to the pool service counts as failed."
    ).tag(config=True)

    allocate_retry_for = Float(
        5.0,
        help="Seconds to keep asking for a GPU while the pool service is unreachable or "
        "restarting when a spawn starts (a restart takes a second or two); then the spawn "
        "fails with a clear message. A request that reached the pool before it went away is "
        "found and kept, not made twice. 0: fail at once.",
    ).tag(config=True)

    release_retry_for = Float(
        600.0,
        help="Seconds to keep retrying a release the pool could not take (it was down). "
        "After that the pool's own reconcile and grant expiry clean up.",
    ).tag(config=True)

    # -- what the Spawner this mixes into provides (JupyterHub ships no type information:
    # annotations only, no values, so the Spawner's own attributes and traits stay in force)

    log: logging.Logger
    user: Any
    name: str
    server: Any
    internal_ssl: bool
    user_options: dict[str, Any]
    _log_name: str
    _spawn_pending: bool

    # -- state ------------------------------------------------------------------------------

    gpupool_lease: dict[str, Any] | None = None
    _gpupool_events: list[dict[str, Any]]
    _gpupool_waiting: bool = False
    #: this spawn's run_pre_spawn_hook has begun (so its events are the ones to stream)
    _gpupool_started: bool = False
    _gpupool_changed: asyncio.Event | None = None
    _gpupool_client: PoolClient | None = None

    def get_state(self) -> dict[str, Any]:
        """Adds the lease id (versioned) to the concrete spawner's state."""
        state: dict[str, Any] = super().get_state()  # type: ignore[misc]  # the Spawner this mixes into has it
        if self.gpupool_lease:
            state[STATE_KEY] = {
                "version": STATE_VERSION,
                "lease": self.gpupool_lease["id"],
                "offer": self.gpupool_lease.get("offer"),
                "slots": self.gpupool_lease.get("slots", []),
                "node": self.gpupool_lease.get("node"),
                "cluster": self.gpupool_lease.get("cluster"),
            }
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores the lease of a running server after a hub restart."""
        super().load_state(state)  # type: ignore[misc]  # the Spawner this mixes into has it
        mine = state.get(STATE_KEY)
        if not mine:
            return
        if mine.get("version") != STATE_VERSION:
            self.log.warning(
                "Ignoring GPU pool state of unknown version %s for %s",
                mine.get("version"),
                self._log_name,
            )
            return
        self.gpupool_lease = {
            "id": mine["lease"],
            "offer": mine.get("offer"),
            "slots": mine.get("slots", []),
            "node": mine.get("node"),
            "cluster": mine.get("cluster"),
        }

    # -- the pool ---------------------------------------------------------------------------

    @property
    def pool(self) -> PoolClient:
        """The client of the pool service (built on first use)."""
        if self._gpupool_client is None:
            self._gpupool_client = PoolClient(
                self._pool_url(), self.pool_api_token, timeout=self.pool_request_timeout
            )
        return self._gpupool_client

    def _pool_url(self) -> str:
        if self.pool_api_url:
            return self.pool_api_url
        services = getattr(self, "user", None) and self.user.settings.get("services", {})
        service = (services or {}).get(self.pool_service_name)
        if service is None or not service.url:
            raise spawn_error(
                "The GPU pool is not configured on this hub (no pool_api_url and no service "
                f"named {self.pool_service_name!r} with a URL).",
                reason="gpupool_config",
                status=500,
            )
        url: str = service.url.rstrip("/") + service.prefix.rstrip("/") + "/api/v1/"
        return url

    @property
    def user_groups(self) -> list[str]:
        """The user's JupyterHub groups (the pool charges requests to them)."""
        return [g.name for g in getattr(self.user, "groups", [])]

    async def _run_apply_user_options(self, user_options: dict[str, Any]) -> None:
        """JupyterHub ≥ 5.3 warns about options nobody applies; the offer is ours to apply."""
        run = getattr(super(), "_run_apply_user_options", None)
        if run is None:
            return
        if self.apply_user_options:  # type: ignore[attr-defined]  # a Spawner trait
            await run(user_options)
        else:
            await run({k: v for k, v in (user_options or {}).items() if k != OPTION})

    # -- choosing the offer -----------------------------------------------------------------

    def chosen_offer(self) -> str:
        """The offer asked for: ``user_options[OPTION]`` (form, query or API), else default.

        Values from forms arrive as lists of strings; API spawns send plain strings.
        """
        value = (self.user_options or {}).get(OPTION)
        if isinstance(value, list):
            value = value[0] if value else ""
        if value is None:
            value = self.default_offer
            if not value and not self.allow_cpu_only and self.pool_offers:
                value = self.pool_offers[0]
        if not isinstance(value, str):
            raise spawn_error(
                f"{OPTION} must be an offer name, not {type(value).__name__}",
                reason="gpupool_invalid",
            )
        return value.strip()

    def chosen_ask(self) -> tuple[str, float | None]:
        """The reason and duration (seconds) of an ask for approval, from ``user_options``
        (the picker's fields; hours): needed for offers that need approval and for
        exceptions to the quota."""
        opts = self.user_options or {}

        def one(key: str) -> str:
            value = opts.get(key, "")
            if isinstance(value, list):
                value = value[0] if value else ""
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise spawn_error(f"{key} must be text", reason="gpupool_invalid")
            return str(value).strip()

        reason, hours = one(REASON_OPTION), one(DURATION_OPTION)
        if not hours:
            return reason, None
        try:
            seconds = float(hours) * 3600
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise spawn_error(
                f"{DURATION_OPTION} must be a number of hours, not {hours!r}",
                reason="gpupool_invalid",
            )
        return reason, seconds

    async def resolve_offer(self) -> str:
        """The offer to ask for; subclasses may look further (KubeSpawner's profiles)."""
        return self.chosen_offer()

    async def options_from_query(self, query_data: dict[str, Any]) -> dict[str, Any]:
        """Refuse a GPU asked for by a link, unless ``allow_offer_from_query``.

        JupyterHub 5 and 6 turn the arguments of ``GET /hub/spawn[/<user>/<server>]?...``
        (6 strips an ``opt-`` prefix first) into ``user_options`` here and spawn at once, with
        no XSRF check: any web page can send a logged-in user's browser there. Raising here
        comes before any lease or server exists; the hub shows the form again with the message.
        """
        options: dict[str, Any] = await maybe_future(super().options_from_query(query_data))  # type: ignore[misc]  # the Spawner this mixes into has it
        if self.allow_offer_from_query:
            return options
        named = {OPTION, f"opt-{OPTION}"} & (set(query_data) | set(options or {}))
        if not named and not await self._query_needs_gpu(options):
            return options  # a CPU-only server, as JupyterHub starts from any link
        self.log.warning(
            "Refused a GPU from the query string for %s (allow_offer_from_query is off)",
            self._log_name,
        )
        refusal = spawn_error(
            "A GPU is not handed out from a link: choose one below and press Start.",
            reason="gpupool_query",
            status=403,
        )
        setattr(refusal, EXPECTED, True)  # the hub logs it as a warning, not a traceback
        quiet_expected_refusals(self.log)
        raise refusal

    async def _query_needs_gpu(self, options: dict[str, Any]) -> bool:
        """Whether a spawn with ``options`` would ask the pool for a GPU (a default offer, a
        KubeSpawner profile naming one, or a hub that has no CPU-only servers)."""
        saved = self.user_options
        self.user_options = options or {}
        try:
            offer = await self.resolve_offer()
        except web.HTTPError:
            return True  # malformed: refuse rather than guess
        finally:
            self.user_options = saved
        return bool(offer) or not self.allow_cpu_only

    def check_offer(self, offer: str) -> None:
        """Server-side enforcement of what the picker showed (forged forms are refused)."""
        if not offer:
            if not self.allow_cpu_only:
                raise spawn_error(
                    "This hub needs every server to hold a GPU: choose one of the offers.",
                    reason="gpupool_cpu_only",
                )
            return
        if self.pool_offers and offer not in self.pool_offers:
            raise spawn_error(
                f"The GPU offer {offer!r} is not available here "
                f"(choose one of: {', '.join(self.pool_offers)}).",
                reason="gpupool_forbidden",
                status=403,
            )

    # -- acquiring -------------------------------------------------------------------------

    def _emit(self, progress: int | None, message: str) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._gpupool_events.append(event)
        if self._gpupool_changed is not None:
            self._gpupool_changed.set()

    async def run_pre_spawn_hook(self) -> Any:
        """Get the GPU first (after options are applied, before ``start_timeout`` runs)."""
        self._gpupool_events = []
        self._gpupool_changed = asyncio.Event()
        self._gpupool_waiting = True
        self._gpupool_started = True
        if self.gpupool_lease:  # a lease a failed stop kept: give it back first
            await self.release_lease("stopped")
        try:
            offer = await self.resolve_offer()
            self.check_offer(offer)
            if offer:
                self.gpupool_lease = await self._acquire(offer)
                try:
                    self.check_lease_placement(self.gpupool_lease)
                except Exception:
                    await self.release_lease("cancelled")
                    raise
        finally:
            self._gpupool_waiting = False
            self._gpupool_changed.set()
        return await maybe_future(super().run_pre_spawn_hook())  # type: ignore[misc]  # the Spawner this mixes into has it

    async def _acquire(self, offer: str) -> dict[str, Any]:
        """POST allocations, adopting a lease this server already has; then wait for the grant.

        Progress names the offer as the picker does (its display name), not by its id.
        """
        name = await self._display_name(offer)
        self._emit(5, f"Asking the GPU pool for {name}")
        try:
            lease = await self._allocate(offer)
        except PoolUnavailable as e:
            self.log.error("GPU pool unreachable for %s: %s", self._log_name, e)
            raise spawn_error(
                "The GPU pool service is not reachable right now, so no GPU could be "
                "reserved and the server was not started. Try again in a minute.",
                reason="gpupool_unavailable",
                status=503,
            ) from e
        except PoolRefused as e:
            raise self._refusal(offer, e, name) from e
        self.gpupool_lease = lease  # known from here on, so a failed wait can give it back
        try:
            lease = await self._wait(lease, name)
        except Exception:
            # not on CancelledError: a hub shutting down mid-queue keeps the request, and the
            # next spawn of this server adopts it (and its place in line); nor for a request
            # still before the administrators, which the next spawn picks up the same way
            kept = cast("dict[str, Any] | None", self.gpupool_lease)  # _wait may have changed it
            if kept is not None and kept.get("keep"):
                self.gpupool_lease = None
            else:
                self._release_soon("cancelled")
            raise
        self._emit(40, f"Got {name} on {lease.get('node') or 'the pool'}; starting your server")
        self.log.info(
            "GPU lease %s for %s: %s on %s",
            lease["id"],
            self._log_name,
            lease["offer"],
            lease.get("node"),
        )
        return lease

    def check_lease_placement(self, lease: dict[str, Any]) -> None:
        """Raise (a spawn error) when this spawner cannot start a server where ``lease`` is;
        the lease is then given back. Every node the pool grants on is reachable by default."""

    async def _allocate(self, offer: str) -> dict[str, Any]:
        """POST allocations; while the pool is unavailable, ask again for ``allocate_retry_for``.

        Asking again is safe: if an earlier attempt was made after all (the pool went away
        before it answered), the pool answers ``already_allocated`` and that lease is adopted.
        """
        delay, deadline = 0.25, time.monotonic() + self.allocate_retry_for
        while True:
            try:
                try:
                    return await self._ask(offer)
                except PoolRefused as e:
                    if e.code != "already_allocated":
                        raise
                    return await self._adopt_or_cancel(offer)
            except PoolUnavailable as e:
                if time.monotonic() + delay > deadline:
                    raise
                self.log.warning(
                    "GPU pool unavailable for %s (%s); asking again in %gs",
                    self._log_name,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _adopt_or_cancel(self, offer: str) -> dict[str, Any]:
        """This server already has a lease (a hub restart mid-queue): keep it if it is for the
        same offer — and so keep its place in the queue — else give it back and ask again.

        The listing holds this hub's leases only: when none is this server's, the lease is
        another hub's (a user of the same name there: user names are the pool's keys) or was
        released meanwhile, and asking again either gets one or the pool's refusal saying so."""
        for lease in await self.pool.leases(user=self.user.name):
            if lease["server"] != self.name or lease["state"] == "released":
                continue
            asked = (lease.get("approval") or {}).get("asked_offer")
            if offer in (lease["offer"], asked):  # an approval may have lowered the offer
                self.log.info("Adopting GPU lease %s of %s", lease["id"], self._log_name)
                return lease
            await self.pool.release(lease["id"], "cancelled")
        return await self._ask(offer)

    async def _ask(self, offer: str) -> dict[str, Any]:
        """POST allocations for this server: the user's groups, this hub's clusters, and the
        form's reason and duration when it asks for approval."""
        reason, duration = self.chosen_ask()
        return await self.pool.allocate(
            self.user.name,
            self.name,
            offer,
            groups=self.user_groups,
            clusters=self.pool_clusters,
            reason=reason,
            duration=duration,
        )

    def _refusal(self, offer: str, e: PoolRefused, name: str | None = None) -> Exception:
        """The spawn page's sentence for a refusal, naming the offer as users read it."""
        text = describe(e.code).spawn_message(name or offer, e.message)
        self.log.warning("GPU pool refused %s for %s: %s", offer, self._log_name, e.message)
        return spawn_error(text, reason=f"gpupool_{e.code or 'refused'}", status=e.status)

    async def _wait(self, lease: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """Wait until the lease is granted and its devices exist, with progress updates
        naming the offer ``name`` (its display name; looked up when not given)."""
        deadline = time.monotonic() + self.queue_timeout
        last = ""
        unreachable_since: float | None = None
        if name is None:
            name = await self._display_name(lease["offer"])
        asked_at = time.monotonic()
        while still_waiting(lease):
            if lease["state"] == "awaiting_approval":
                msg = f"Waiting for an administrator to approve {name} ({asked_ago(lease)})"
                if time.monotonic() - asked_at > self.approval_wait:
                    self.gpupool_lease = {**lease, "keep": True}
                    raise spawn_error(
                        f"Your request for {name} is still waiting for an administrator "
                        f"({asked_ago(lease)}). It stays asked: you will hear of the decision, "
                        "and starting this server again picks it up.",
                        reason="gpupool_awaiting_approval",
                        status=503,
                    )
            elif lease["state"] == "queued":
                pos = lease.get("position")
                where = f"{ordinal(pos)} in line" if pos else "in line"
                msg = f"Waiting for {name}: {where}, {wait_text(lease.get('eta_seconds'))}"
            else:
                where = lease.get("node") or "the pool"
                msg = f"Preparing {name} on {where} (creating the MIG instance)"
            if msg != last:
                self._emit(10 if lease["state"] == "queued" else 30, msg)
                last = msg
            if lease["state"] != "awaiting_approval" and time.monotonic() > deadline:
                await self._release_now(lease["id"], "cancelled")
                self.gpupool_lease = None
                minutes = round(self.queue_timeout / 60)
                raise spawn_error(
                    f"No {name} became free within {minutes} minutes; your request "
                    "left the queue. Try again later or pick another GPU.",
                    reason="gpupool_queue_timeout",
                    status=503,
                )
            await asyncio.sleep(self.queue_poll_interval)
            try:
                lease = await self.pool.lease(lease["id"])
                unreachable_since = None
            except PoolUnavailable as e:  # keep our place; the service may come back
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    self.log.warning("GPU pool unreachable while %s waits: %s", self._log_name, e)
                    self._emit(None, "The GPU pool is not answering; still waiting in line")
        if lease["state"] not in ("granted", "active"):
            self.gpupool_lease = None
            reason = lease.get("release_reason") or lease["state"]
            raise spawn_error(
                f"Your request for {name} ended while waiting ({reason}"
                + (f": {lease['message']}" if lease.get("message") else "")
                + ").",
                reason=f"gpupool_{reason}",
                status=409,
            )
        return lease

    async def _display_name(self, offer: str) -> str:
        """The offer's display name (as the picker shows it); its name if the pool won't say."""
        try:
            offers = await self.pool.offers(self.user.name, self.user_groups, self.pool_clusters)
        except (PoolUnavailable, PoolRefused):
            return offer
        return next((o.get("display_name") or offer for o in offers if o["name"] == offer), offer)

    async def bind_lease(self, started: Any = None) -> None:
        """The server runs: bind the grant (granted → active) so it does not expire, and tell
        the pool where the server listens (``started``: what ``start`` returned)."""
        if not self.gpupool_lease:
            return
        lease_id = self.gpupool_lease["id"]
        url = internal_url(started, self.server.base_url if self.server else "/", self.internal_ssl)
        if url:
            try:
                await self.pool.set_server_url(lease_id, url)
            except (PoolUnavailable, PoolRefused) as e:
                # not fatal: the reclaimer reads the server through the proxy meanwhile
                self.log.warning("Could not give the pool %s's address: %s", self._log_name, e)
        try:
            self.gpupool_lease = await self.pool.keepalive(lease_id)
        except PoolRefused as e:
            # the grant expired or an admin released it while the server started
            raise spawn_error(
                f"Your GPU lease ended before the server was up ({e.message}).",
                reason="gpupool_lost",
                status=409,
            ) from e
        except PoolUnavailable as e:
            self.log.warning("Could not bind GPU lease %s yet: %s", lease_id, e)
            IOLoop.current().add_callback(self._bind_later, lease_id)

    async def _bind_later(self, lease_id: str) -> None:
        delay, deadline = 2.0, time.monotonic() + self.release_retry_for
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            if not self.gpupool_lease or self.gpupool_lease["id"] != lease_id:
                return
            try:
                await self.pool.keepalive(lease_id)
                return
            except PoolUnavailable:
                delay = min(delay * 2, 60)
            except PoolRefused as e:
                self.log.error("GPU lease %s of %s is gone: %s", lease_id, self._log_name, e)
                return

    # -- progress --------------------------------------------------------------------------

    async def progress(self) -> Any:
        """Queue position and estimate while waiting, then the concrete spawner's events.

        The page shows the latest event's ``message`` as its status line, so after a grant
        the pool's message stays there: JupyterHub's placeholder progress ("Spawning
        server...", all a LocalProcessSpawner has) is left out. KubeSpawner's pod events follow.
        """
        # the hub may open the stream before run_pre_spawn_hook began (it awaits the
        # authenticator and other hooks first): wait for this spawn's own events
        while self._spawn_pending and not self._gpupool_started:
            await asyncio.sleep(0.1)
        sent = 0
        events = getattr(self, "_gpupool_events", [])
        while True:
            while sent < len(events):
                yield events[sent]
                sent += 1
            if not self._gpupool_waiting or self._gpupool_changed is None:
                break
            self._gpupool_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._gpupool_changed.wait(), self.queue_poll_interval * 5)
        if sent and self._placeholder_progress():
            return
        async for event in super().progress():  # type: ignore[misc]  # the Spawner this mixes into has it
            yield event

    def _placeholder_progress(self) -> bool:
        """Whether the concrete spawner's progress is JupyterHub's one-line placeholder."""
        mro = type(self).__mro__
        for cls in mro[mro.index(GPUPoolSpawnerMixin) + 1 :]:
            if "progress" in vars(cls):
                return cls is Spawner
        return True

    # -- releasing --------------------------------------------------------------------------

    async def _release_now(self, lease_id: str, reason: str) -> bool:
        """Release one lease; False if the pool could not be reached (retry later)."""
        try:
            await self.pool.release(lease_id, reason)
        except PoolRefused as e:
            if e.status != 404 and e.code != "not_live":
                self.log.warning("Releasing GPU lease %s: %s", lease_id, e)
        except PoolUnavailable as e:
            self.log.warning("Could not release GPU lease %s yet: %s", lease_id, e)
            return False
        return True

    async def release_lease(self, reason: str = "stopped") -> None:
        """Give the lease back now; if the pool is away, keep retrying in the background."""
        lease, self.gpupool_lease = self.gpupool_lease, None
        if lease is None:
            return
        if not await self._release_now(lease["id"], reason):
            IOLoop.current().add_callback(self._release_later, lease["id"], reason)
        else:
            self.log.info("Released GPU lease %s of %s (%s)", lease["id"], self._log_name, reason)

    def _release_soon(self, reason: str) -> None:
        """From a cancelled wait: release without awaiting here."""
        lease, self.gpupool_lease = self.gpupool_lease, None
        if lease is not None:
            IOLoop.current().add_callback(self._release_later, lease["id"], reason, 0.0)

    async def _release_later(self, lease_id: str, reason: str, delay: float = 2.0) -> None:
        deadline = time.monotonic() + self.release_retry_for
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            if await self._release_now(lease_id, reason):
                return
            delay = min(max(delay, 1.0) * 2, 60)
        self.log.error(
            "Gave up releasing GPU lease %s; the pool's reconcile takes it (a lease of a hub "
            "other than the pool's own waits for an admin)",
            lease_id,
        )

    async def stop(self, now: bool = False) -> None:
        """Stop the server, then give its GPU back."""
        try:
            await super().stop(now=now)  # type: ignore[misc]  # the Spawner this mixes into has it
        finally:
            await self.release_lease("stopped")

    async def poll(self) -> int | None:
        """A server found gone gives its GPU back at once (not at the next stop)."""
        status: int | None = await super().poll()  # type: ignore[misc]  # the Spawner this mixes into has it
        if status is not None and self.gpupool_lease and not self._gpupool_waiting:
            await self.release_lease("stopped")
        return status

    async def run_post_stop_hook(self) -> Any:
        """Always runs when the hub stops a server (also after a failed spawn): release."""
        self._gpupool_started = False  # the next spawn streams its own events
        await self.release_lease("stopped")
        return await maybe_future(super().run_post_stop_hook())  # type: ignore[misc]  # the Spawner this mixes into has it

    # -- environment ------------------------------------------------------------------------

    def gpupool_env(self) -> dict[str, str]:
        """The server environment: ``GPUPOOL_API_URL`` always (a CPU-only server's lab asks the
        pool for a GPU there), and for a granted lease ``GPUPOOL_LEASE_ID``, ``GPUPOOL_OFFER``."""
        env = {"GPUPOOL_API_URL": self.server_pool_api_url or self._pool_url()}
        if self.gpupool_lease:
            env["GPUPOOL_LEASE_ID"] = self.gpupool_lease["id"]
            env["GPUPOOL_OFFER"] = self.gpupool_lease.get("offer") or ""
        return env

    # -- the picker -------------------------------------------------------------------------

    async def gpupool_choices(self, with_quota: bool = True) -> dict[str, Any]:
        """What the picker shows: offers with live availability, the user's quota (unless
        ``with_quota`` is off: KubeSpawner's profile form has no place for it), errors."""
        out: dict[str, Any] = {"offers": [], "quota": None, "error": None}
        try:
            offers = await self.pool.offers(self.user.name, self.user_groups, self.pool_clusters)
            if with_quota:
                out["quota"] = await self.pool.user(self.user.name)
        except (PoolUnavailable, PoolRefused) as e:
            self.log.error("GPU pool offers for %s: %s", self._log_name, e)
            out["error"] = "The GPU pool is not answering right now; GPUs cannot be chosen."
            return out
        if self.pool_offers:
            by_name = {o["name"]: o for o in offers}
            offers = [by_name[n] for n in self.pool_offers if n in by_name]
        out["offers"] = annotate(offers)
        return out

    async def render_picker(self) -> str:
        """The options form: offers with free count, queue, wait, cost and quota fit."""
        choices = await self.gpupool_choices()
        selected = self.default_offer
        previous = (self.user_options or {}).get(OPTION) if self.user_options else None
        if isinstance(previous, list):
            previous = previous[0] if previous else None
        if isinstance(previous, str):
            selected = previous
        return render(choices, selected, self.allow_cpu_only)

    async def get_options_form(self) -> str:
        """Our picker, unless the admin configured an ``options_form`` of their own."""
        if self.options_form:  # type: ignore[attr-defined]  # a Spawner trait
            form: str = await super().get_options_form()  # type: ignore[misc]  # the Spawner this mixes into has it
            return form
        return await self.render_picker()
