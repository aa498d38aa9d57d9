"""``jupyterhub-gpupool reclaimer``: the idle-GPU reclaimer as a JupyterHub service.

A thin traitlets application around :class:`~jupyterhub_gpupool.reclaim.core.Reclaimer`.
Managed by the hub (``configure_hub(c, reclaimer=True)``), it reads ``JUPYTERHUB_API_TOKEN``,
``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_SERVICE_NAME`` from the environment the hub gives it;
external, it takes a config file (``jupyterhub_gpupool_reclaimer_config.py``) or flags and a
token in ``$GPUPOOL_RECLAIMER_TOKEN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any
from urllib.parse import urlparse

from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Integer, TraitError, Unicode, default, validate
from traitlets.utils.importstring import import_item

from .._version import __version__
from ..health import HealthHandler, LoopWatch, health
from ..hubclient import HubClient
from ..poolclient import PoolClient
from ..strictcli import StrictCommandLine
from .core import Reclaimer, default_holder


#: Options traitlets itself understands on every application.
class ReclaimerApp(StrictCommandLine):
    """The idle-GPU reclaimer: observes leased servers, lets the pool decide, carries it out."""

    name = "jupyterhub-gpupool-reclaimer"
    command = "reclaimer"
    version = __version__
    description = (
        "Reclaim idle GPUs of the JupyterHub GPU pool: read each leased server's kernels and "
        "its user's activity, post them to the pool, and carry out what it decides (save, then "
        "stop, restart without a GPU or on a smaller offer)."
    )

    aliases = {
        "config": "ReclaimerApp.config_file",
        "service-url": "ReclaimerApp.service_url",
        "hub-api-url": "ReclaimerApp.hub_api_url",
        "proxy-url": "ReclaimerApp.proxy_url",
        "interval": "ReclaimerApp.interval",
        "concurrency": "ReclaimerApp.concurrency",
        "metrics-port": "ReclaimerApp.metrics_port",
        "log-level": "Application.log_level",
    }
    flags = {
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log at debug level."),
    }

    config_file = Unicode(
        "jupyterhub_gpupool_reclaimer_config.py",
        help="Python config file to load (a missing default file is fine).",
    ).tag(config=True)
    service_url = Unicode(
        help="URL of the pool service, e.g. http://127.0.0.1:10101/services/gpupool/ (its API "
        "is {service_url}api/v1/; a URL ending in /api/v1 is used as is). Default: "
        "$GPUPOOL_SERVICE_URL, else the pool service's default address."
    ).tag(config=True)
    api_token = Unicode(
        help="Token of the reclaimer's hub service (its role: list:users, read:servers, "
        "servers, access:servers, custom:gpupool:reclaim). Default: "
        "$GPUPOOL_RECLAIMER_TOKEN, else $JUPYTERHUB_API_TOKEN (what the hub gives a managed "
        "service). Prefer the environment: a flag shows in `ps`."
    ).tag(config=True)
    hub_api_url = Unicode(
        help="The hub's REST API. Default: $JUPYTERHUB_API_URL, else http://127.0.0.1:8081/hub/api."
    ).tag(config=True)
    proxy_url = Unicode(
        help="Where the hub's proxy routes users' servers (/user/<name>/...): its public "
        "origin, e.g. http://127.0.0.1:8000. The reclaimer reads kernels and saves files "
        "there. Default: the origin of $JUPYTERHUB_PUBLIC_HUB_URL, else http://127.0.0.1:8000."
    ).tag(config=True)
    holder = Unicode(
        help="This replica's name in the pool's leader lock (default: host:pid). Replicas "
        "must have different names; only the leader observes and acts."
    ).tag(config=True)
    interval = Float(
        30.0,
        help="Seconds between rounds. Each round is one window of the idle signal (30 s, like "
        "Run:ai's windows); the pool's policies (idle_timeout, warn_before) count in them.",
    ).tag(config=True)
    leader_ttl = Float(
        180.0,
        help="Seconds the leader lock lasts unless renewed (5-600): a replica that dies is "
        "replaced after at most this long. Renewed every round and during long actions.",
    ).tag(config=True)
    concurrency = Integer(
        10,
        help="Most requests to users' servers in flight at once while observing, and most "
        "actions carried out at once (like jupyterhub-idle-culler's --concurrency: a round "
        "must not flood the hub or the proxy).",
    ).tag(config=True)
    api_page_size = Integer(
        200, help="Users per page of the hub's GET /users, and leases per page of the pool's."
    ).tag(config=True)
    backoff_max = Float(
        900.0,
        help="Longest pause (seconds) between rounds while the hub or the pool is unreachable; "
        "the pause doubles from `interval` with each failed round in a row.",
    ).tag(config=True)
    request_timeout = Float(
        20.0, help="Seconds before a request to the hub or the pool is abandoned."
    ).tag(config=True)
    server_timeout = Float(
        10.0,
        help="Seconds before a request to a user's server is abandoned (the server then counts "
        "as unreachable this round: no kernel observation, so nothing is decided on it).",
    ).tag(config=True)
    require_save = Bool(
        True,
        help="Act only after saving worked: when the server cannot save (no save-all endpoint "
        "and a checkpoint fails, or the server refuses), the action fails and the user keeps "
        "the GPU. False stops anyway.",
    ).tag(config=True)
    stop_timeout = Float(
        300.0, help="Seconds to wait for the hub to stop a server before the action fails."
    ).tag(config=True)
    start_timeout = Float(
        300.0,
        help="Seconds to wait for a server restarted without a GPU or on a smaller offer to be "
        "ready (the GPU is reclaimed either way; a failed restart is reported).",
    ).tag(config=True)
    shrink_timeout = Float(
        600.0,
        help="Seconds to wait for a shrink's reserved target lease to be ready before giving up "
        "(the action fails and the user keeps the GPU: make-before-break).",
    ).tag(config=True)
    poll_interval = Float(
        1.0, help="Seconds between checks while waiting for a server or a target lease."
    ).tag(config=True)
    notify_hook = AnyTrait(
        None,
        allow_none=True,
        help="Called as notify_hook(event, lease, decision) at each notice, cancellation and "
        "action: event is notice, cancel, act, done or failed; lease the pool's lease JSON; "
        "decision the pool's decision (done/failed add outcome). A callable (may be async) or "
        "its import name, e.g. 'jupyterhub_gpupool.reclaim.hooks.webhook_from_env'. What it "
        "raises is logged and counted, never stops the reclaimer.",
    ).tag(config=True)
    hook_timeout = Float(
        30.0, help="Seconds an async notify_hook may take before it is abandoned (logged)."
    ).tag(config=True)
    metrics_port = Integer(
        0,
        help="Serve Prometheus metrics at http://{metrics_ip}:{metrics_port}/metrics and the "
        "health check at /health (0: neither is served; the counters are in the log either "
        "way).",
    ).tag(config=True)
    health_stall_after = Float(
        900.0,
        help="GET /health answers 503 when a round has run this many seconds without ending "
        "(it waits on servers that never stop) or the event loop ran this late. Longer than "
        "the slowest legitimate round: save, stop and restart timeouts together.",
    ).tag(config=True)
    metrics_ip = Unicode(
        "127.0.0.1", help="Interface the metrics endpoint listens on (with metrics_port)."
    ).tag(config=True)

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO

    @default("service_url")
    def _service_url_default(self) -> str:
        return os.environ.get("GPUPOOL_SERVICE_URL", "http://127.0.0.1:10101/services/gpupool/")

    @default("api_token")
    def _api_token_default(self) -> str:
        return os.environ.get("GPUPOOL_RECLAIMER_TOKEN") or os.environ.get(
            "JUPYTERHUB_API_TOKEN", ""
        )

    @default("hub_api_url")
    def _hub_api_url_default(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("proxy_url")
    def _proxy_url_default(self) -> str:
        public = urlparse(os.environ.get("JUPYTERHUB_PUBLIC_HUB_URL", ""))
        if public.scheme and public.netloc:
            return f"{public.scheme}://{public.netloc}"
        return "http://127.0.0.1:8000"

    @default("holder")
    def _holder_default(self) -> str:
        service = os.environ.get("JUPYTERHUB_SERVICE_NAME")
        return f"{service}@{default_holder()}" if service else default_holder()

    @validate("concurrency")
    def _valid_concurrency(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] < 1:
            raise TraitError("concurrency must be at least 1")
        value: int = proposal["value"]
        return value

    @validate("leader_ttl")
    def _valid_ttl(self, proposal: dict[str, Any]) -> float:
        if not 5 <= proposal["value"] <= 600:
            raise TraitError("leader_ttl must be between 5 and 600 seconds")
        value: float = proposal["value"]
        return value

    @validate("interval")
    def _valid_interval(self, proposal: dict[str, Any]) -> float:
        if proposal["value"] <= 0:
            raise TraitError("interval must be > 0")
        value: float = proposal["value"]
        return value

    @property
    def api_url(self) -> str:
        """The pool API's base URL, ending in ``/``."""
        url = self.service_url.rstrip("/")
        return url + "/" if url.endswith("/api/v1") else url + "/api/v1/"

    def initialize(self, argv: list[str] | None = None) -> None:
        """After the shared start (:class:`StrictCommandLine`), refuse to start without a token."""
        super().initialize(argv)
        if not self.api_token:
            raise SystemExit(
                "The reclaimer needs a token: $JUPYTERHUB_API_TOKEN (a hub-managed service "
                "has it), $GPUPOOL_RECLAIMER_TOKEN or --ReclaimerApp.api_token"
            )

    def resolved_hook(self) -> Any:
        """``notify_hook`` as a callable (an import name is imported)."""
        hook = self.notify_hook
        if isinstance(hook, str):
            hook = import_item(hook) if hook else None
        if hook is not None and not callable(hook):
            raise SystemExit(f"notify_hook is not callable: {hook!r}")
        return hook

    def make_reclaimer(self, **overrides: Any) -> Reclaimer:
        """The core with this application's settings (tests override clock and sleep)."""
        pool = PoolClient(self.api_url, self.api_token, timeout=self.request_timeout)
        hub = HubClient(
            self.hub_api_url,
            self.api_token,
            timeout=self.request_timeout,
            page_size=self.api_page_size,
            proxy_url=self.proxy_url,
        )
        options: dict[str, Any] = {
            "holder": self.holder,
            "interval": self.interval,
            "leader_ttl": self.leader_ttl,
            "concurrency": self.concurrency,
            "backoff_max": self.backoff_max,
            "page_size": self.api_page_size,
            "notify_hook": self.resolved_hook(),
            "hook_timeout": self.hook_timeout,
            "require_save": self.require_save,
            "server_timeout": self.server_timeout,
            "stop_timeout": self.stop_timeout,
            "start_timeout": self.start_timeout,
            "shrink_timeout": self.shrink_timeout,
            "poll_interval": self.poll_interval,
            "log": self.log,
        }
        options.update(overrides)
        return Reclaimer(pool, hub, **options)

    def start_metrics(self, reclaimer: Reclaimer) -> Any:
        """Serve ``/metrics`` and ``/health`` on ``metrics_port`` (None when 0)."""
        if not self.metrics_port:
            return None
        from tornado import web
        from tornado.httpserver import HTTPServer

        metrics = reclaimer.metrics
        watch = LoopWatch()
        watch.start()

        class MetricsHandler(web.RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.finish(metrics.render())

        def check() -> tuple[bool, dict[str, Any]]:
            began = reclaimer.round_started
            stalled = 0.0 if began is None else time.monotonic() - began
            return health("round", stalled, watch.lag, self.health_stall_after)

        app = web.Application([(r"/metrics", MetricsHandler), (r"/health", HealthHandler)])
        app.settings["health"] = check
        server = HTTPServer(app)
        server.listen(self.metrics_port, self.metrics_ip)
        self.log.info("Metrics at http://%s:%d/metrics", self.metrics_ip, self.metrics_port)
        return server

    async def start_async(self) -> None:
        """Run rounds until SIGTERM/SIGINT, then give up the lead."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        async def pause(seconds: float) -> None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

        reclaimer = self.make_reclaimer(sleep=pause)
        server = self.start_metrics(reclaimer)
        self.log.info(
            "GPU pool reclaimer %s: pool %s, hub %s, servers via %s, a round every %gs",
            reclaimer.holder,
            self.api_url,
            self.hub_api_url,
            self.proxy_url,
            self.interval,
        )
        try:
            await reclaimer.run(stop)
        finally:
            if server is not None:
                server.stop()
        self.log.info("Reclaimer stopped")

    def start(self) -> None:
        """Run the reclaimer."""
        asyncio.run(self.start_async())


main = ReclaimerApp.launch_instance

if __name__ == "__main__":
    main()
