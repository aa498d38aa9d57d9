"""``jupyterhub-gpupool service``: the pool as a JupyterHub service (managed or external).

Configured like JupyterHub itself: traits in ``jupyterhub_gpupool_config.py`` or on the command
line. The hub's environment (``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_SERVICE_URL``,
``JUPYTERHUB_SERVICE_PREFIX`` …) supplies the rest when the hub manages the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth
from jupyterhub.utils import url_path_join
from sqlalchemy import Engine
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Any as AnyTrait
from traitlets import Bool, Enum, Float, Integer, List, TraitError, Unicode, default, validate

from .._version import __version__
from ..dbutil import LeaderLock, SchemaError, make_engine, prepare_schema
from ..extras import MissingExtra
from ..health import LoopWatch, health
from ..hubclient import HubClient
from ..kube.kubejobs import KubeJobs
from ..kube.kueue import KueueAdmission
from ..kube.labeller import MigLabeller
from ..kube.occupancy import KubeOccupancy
from ..kube.sharing import KubeSharing
from ..logredact import redact
from ..pool import commands
from ..pool.catalog import default_catalog
from ..pool.errors import PoolError
from ..pool.kernels import KernelRules
from ..poolconfig import load_pool_config
from ..store import Store
from ..store.read.budgets import BudgetWarningView
from ..strictcli import StrictCommandLine
from .alerts import AlertMonitor, PoolAlerts
from .apihandlers.base import MAX_BODY
from .deadlines import NoticeDeadlines
from .metrics import PoolMetrics
from .minutes import MinuteFlusher
from .notify import Notifier, resolve_hook
from .restarts import Restarts
from .routes import routes
from .serialize.budgets import budget_warning_json
from .telemetry_loop import LocalTelemetry, nvml_reader, sim_nodes
from .utilization import MinuteAggregator, UtilizationBuffer
from .writer import BatchWriter, ProcessBatchWriter, Writer, settle_garbage_collector


class PoolService(StrictCommandLine):
    """The GPU pool service."""

    name = "jupyterhub-gpupool-service"
    command = "service"
    classes = [MigLabeller, KubeOccupancy, KubeSharing, KueueAdmission, KubeJobs, PoolAlerts]
    version = __version__
    description = "Serve the GPU pool's REST API as a JupyterHub service."

    #: The approvals' notify_hook caller (made by ``initialize``, or by ``make_app``).
    notifier: Notifier | None = None
    #: The event loop's lateness, for the health check (made with the app, started with it).
    loop_watch: LoopWatch | None = None

    aliases = {
        "config": "PoolService.config_file",
        "db-url": "PoolService.db_url",
        "pool-config": "PoolService.pool_config_file",
        "ip": "PoolService.ip",
        "port": "PoolService.port",
        "log-level": "Application.log_level",
    }
    flags = {
        "upgrade-db": ({"PoolService": {"upgrade_db": True}}, "Upgrade the database on start."),
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log at debug level."),
    }

    config_file = Unicode(
        "jupyterhub_gpupool_config.py",
        help="Python config file to load (a missing default file is fine).",
    ).tag(config=True)
    db_url = Unicode(
        "sqlite:///jupyterhub-gpupool.sqlite",
        help="SQLAlchemy URL of the pool database: SQLite by default, "
        "postgresql://user@host/db in production.",
    ).tag(config=True)
    upgrade_db = Bool(
        False,
        help="Apply pending database migrations on start, under the migration lock (replicas "
        "starting together migrate once). Otherwise a service that finds an old schema waits "
        "up to schema_wait seconds for `jupyterhub-gpupool upgrade-db` (the Helm chart's hook "
        "Job) to bring it up to date. A new empty database is always created (under the lock).",
    ).tag(config=True)
    schema_wait = Float(
        60.0,
        help="Seconds a service that finds the database schema behind (and is not told to "
        "upgrade it) waits for `jupyterhub-gpupool upgrade-db` before it exits, logging what it "
        "waits for every 10 seconds. 0: exit at once.",
    ).tag(config=True)
    health_stall_after = Float(
        60.0,
        help="GET {prefix}health answers 503 when the writer has owed answers this many "
        "seconds without giving one, or the event loop ran this late (Kubernetes' liveness "
        "probe then restarts the replica).",
    ).tag(config=True)
    pool_config_file = Unicode(
        "",
        help="YAML file declaring nodes, offers and quotas. Changes made through the admin API "
        "win over it until reset. Empty: everything comes from agents and the API.",
    ).tag(config=True)
    on_kubernetes = Bool(
        help="The pool's GPUs are Kubernetes nodes' (default: true when the service runs in a "
        "pod, KUBERNETES_SERVICE_HOST set, with telemetry_source = agents). The pool config must "
        "then say of every non-MIG GPU whether it is shared (sharing: exclusive or shared): "
        "'auto' is refused, since a node's device plugin or DRA claim decides it before any "
        "request comes.",
    ).tag(config=True)
    telemetry_source = Enum(
        ["agents", "sim", "nvml"],
        default_value="agents",
        help="Where inventory and utilization come from: node agents posting to the API "
        "(agents); or, on one machine, the service itself reading every node of the pool config "
        "on the simulated NVML (sim, needs pool_config_file) or this machine's GPUs as one node "
        "through real NVML (nvml, needs nvidia-ml-py). Agents may post in any mode.",
    ).tag(config=True)
    node_name = Unicode(
        help="Node name of this machine's GPUs with telemetry_source = nvml (default: the host "
        "name)."
    ).tag(config=True)
    dynamic_mig = Bool(
        False,
        help="With telemetry_source = nvml: the pool may repartition this machine's MIG-enabled "
        "GPUs (NVML cannot tell); the service then creates and destroys MIG instances itself, "
        "which NVML allows root only.",
    ).tag(config=True)
    sample_interval = Float(
        5.0, help="Seconds between utilization reads with telemetry_source = sim or nvml."
    ).tag(config=True)
    ip = Unicode(help="Interface to listen on (default: from JUPYTERHUB_SERVICE_URL).").tag(
        config=True
    )
    port = Integer(help="Port to listen on (default: from JUPYTERHUB_SERVICE_URL).").tag(
        config=True
    )
    base_url = Unicode(
        help="URL prefix of the service (default: JUPYTERHUB_SERVICE_PREFIX, else "
        "/services/gpupool/)."
    ).tag(config=True)
    job_runner_timeout = Float(
        120.0,
        help="Seconds a job's runner may go without reporting it before the reconcile fails the "
        "job (runner_lost) and releases its lease (for a preempted job: past its deadline).",
    ).tag(config=True)
    kernel_idle_timeout = Float(
        3600.0,
        help="Seconds a GPU kernel (a kernel lease) may run nothing before it gets its idle "
        "notice (0: kernels are never shut down for being idle). Judged from the execution "
        "states its server's gpupool kernel provisioner reports.",
    ).tag(config=True)
    kernel_notice = Float(
        300.0,
        help="Seconds between an idle GPU kernel's notice and its shutdown (its lease released; "
        "a cell run meanwhile cancels the notice).",
    ).tag(config=True)
    kernel_report_timeout = Float(
        120.0,
        help="Seconds a GPU kernel's lease lives without a report from its server's provisioner "
        "before it is released (orphaned): the server or the kernel is gone.",
    ).tag(config=True)
    grant_timeout = Float(
        600.0,
        help="Seconds a granted slice is held for a server that has not bound it yet "
        "(keepalive) before it is released as expired. A grant waiting for the MIG instance "
        "the pool creates for it (dynamic MIG) gets this time again once the instance exists.",
    ).tag(config=True)
    aging_interval = Float(
        600.0, help="Seconds of waiting that lift a queued request by one priority level."
    ).tag(config=True)
    reserve_after = Float(
        1800.0,
        help="Seconds after which a waiting request holds one node back (the one closest to "
        "fitting it): nothing new is placed there until it fits; the rest of the pool stays "
        "in use.",
    ).tag(config=True)
    mig_attempts = Integer(
        3,
        help="Dynamic MIG: failed attempts at creating a planned MIG instance (or destroying an "
        "unwanted one) before the pool gives up; a grant waiting for the instance is then "
        "released with reason mig-failed.",
    ).tag(config=True)
    decisions = Enum(
        ["auto", "thread", "process"],
        "auto",
        help="Where allocate, release and keepalive run, in batches of one transaction each: "
        "'thread' (a thread of the service: HTTP handling and decisions share one core), "
        "'process' (a child process with its own database connections: they use two cores, "
        "which under load gives more grants per second and lower latency; the service's views "
        "follow its commits within a second), or 'auto': 'process' on PostgreSQL, 'thread' on "
        "SQLite (the small single-machine setup, where one process is simpler).",
    ).tag(config=True)
    restart_poll = Float(
        1.0,
        help="Seconds between looks at the target lease a restart waits for (a move, or a GPU "
        "for a CPU-only server, in line). A release wakes waiting restarts at once: a hand-off "
        "never waits for this.",
    ).tag(config=True)
    housekeeping_interval = Float(
        15.0, help="Seconds between expiring unbound grants and serving the queue."
    ).tag(config=True)
    reconcile_on_start = Bool(
        True,
        help="On start, release leases of servers the hub no longer runs (needs the service "
        "token to hold list:users and read:servers); the pool's own hub's leases only.",
    ).tag(config=True)
    busy_threshold = Float(
        5.0, help="GPU utilization (percent) at or above which a sample counts as busy time."
    ).tag(config=True)
    utilization_window = Float(
        900.0,
        help="Seconds of full-rate utilization samples kept per device: in memory for live "
        "views, and in the database (utilization_samples) for the reclaim rounds, which read "
        "every replica's samples of their window there. Keep it above the reclaimer's longest "
        "window (4 rounds).",
    ).tag(config=True)
    utilization_flush_interval = Float(
        60.0,
        help="Seconds between flushes of the one-minute utilization aggregates to the database "
        "(a minute flushed in parts is merged).",
    ).tag(config=True)
    utilization_retention_days = Float(
        30.0,
        help="Days of one-minute utilization aggregates kept in the database (older ones are "
        "deleted; 0 keeps them forever).",
    ).tag(config=True)
    hub_api_url = Unicode(help="JupyterHub API URL (default: JUPYTERHUB_API_URL).").tag(config=True)
    cookie_secret = Unicode(
        help="Hex key signing the login cookies of the admin panel and the user page "
        "(default: $GPUPOOL_COOKIE_SECRET). Every replica must share one, or a browser moving "
        "to another replica logs in through the hub again; empty: a random key per process.",
    ).tag(config=True)
    agent_timeout = Float(
        120.0,
        help="Seconds without a word (samples or inventory) from a node's agent after which the "
        "node is marked unreachable: it takes no new grants and shows so in GET pool and "
        "/metrics; its leases stay until an admin or the node decides. The agent's next "
        "report makes it reachable again. 0 never marks a node.",
    ).tag(config=True)
    reconcile_interval = Float(
        300.0,
        help="Seconds between reconciles with the hub while the service runs (0: only on "
        "start): leases whose server the hub no longer runs or spawns are released (reason "
        "orphaned), requests still queued for such a server end (cancelled), and requests "
        "awaiting approval for a server the hub no longer has at all (deleted) are withdrawn. "
        "Only the leases of the pool's own hub: those of another hub's spawner are left alone.",
    ).tag(config=True)
    orphan_after = Float(
        600.0,
        help="Seconds a lease or request must exist before the periodic reconcile may take it "
        "for an orphan: a spawner asks the pool before the hub lists its server as spawning.",
    ).tag(config=True)
    hub_spawners = List(
        Unicode(),
        help="The spawner services of the pool's own hub (default: <service name>-spawner, as "
        "configure_hub registers it). Another service with the spawn scope is the spawner of "
        "another hub the pool serves: its leases are kept as that hub's, it sees and acts on "
        "those only, and the reconcile with the pool's hub leaves them alone.",
    ).tag(config=True)
    max_requests_per_user = Integer(
        0,
        help="Live GPU requests (queued, granted or held) one user may have at once; beyond, "
        "allocate answers 429 too_many_requests. 0 derives it from the hub's named-server "
        "limit ($GPUPOOL_NAMED_SERVER_LIMIT, which configure_hub passes on): twice the number "
        "of servers a user may run (each may hold a lease and a resize target), or 10 when the "
        "limit is unknown or unlimited. -1: no cap.",
    ).tag(config=True)
    check_user_servers = Bool(
        True,
        help="A user's own allocate (not the spawner's) may only name a server of theirs the "
        "hub knows (asked through the hub API; needs read:servers).",
    ).tag(config=True)
    reclaim_stale_after = Float(
        120.0,
        help="Seconds after which what a reclaim round knows of a lease (GPU samples, its "
        "server's kernels, the user's presence, the round's window) is too old to count or act "
        "on: stale data never reclaims a GPU.",
    ).tag(config=True)
    reclaim_claim_timeout = Float(
        900.0,
        help="Seconds a reclaim action claimed by a round may go without the reclaimer's "
        "outcome before a round hands it out again (the reclaimer died mid-action).",
    ).tag(config=True)
    notice_enforce_after = Float(
        120.0,
        help="Seconds past the deadline of an admin or drain notice (an admin's reclaim with "
        "notice, a node drained by a deadline) after which the pool service carries it out "
        "itself when no reclaimer has: it stops the server through the hub and releases the "
        "lease (reason admin). A running reclaimer acts first, at its next round, and saves "
        "the user's open documents before the stop; keep this above its round interval. "
        "Idle notices are always the reclaimer's. Negative: never.",
    ).tag(config=True)
    notice_stop_timeout = Float(
        120.0,
        min=1.0,
        help="Seconds the pool service waits for the hub to stop a server when it carries out "
        "an overdue notice itself (notice_enforce_after). A server not stopped by then keeps "
        "its lease; the notice is tried again once its claim is older than "
        "reclaim_claim_timeout. Raise it for spawners that take long to stop (a pod with a "
        "long termination grace period).",
    ).tag(config=True)
    notify_hook = AnyTrait(
        None,
        allow_none=True,
        help="Called as notify_hook(event, lease, details) when a request needs an "
        "administrator's approval (event approval-requested, details['for'] == 'admins') and "
        "when it is approved or denied (approved, denied; for the user), and when a budget "
        "reaches 80 % or 100 % (budget-warning, once per level and period). A callable (may be "
        "async) or its import name, e.g. 'jupyterhub_gpupool.reclaim.hooks.webhook_from_env' "
        "(the reclaimer's webhook example takes these events too). Also when one of the "
        "pool's alerts is raised or resolved (events alert, alert-resolved; lease {}, the "
        "alert in details; see PoolAlerts). It runs in the background: what it raises is "
        "logged, never fails the request.",
    ).tag(config=True)
    budget_warn_before = Float(
        600.0,
        help="Seconds of notice a running lease gets when its quota's budget (budget_action: "
        "stop) is spent, before its server is stopped (open documents saved first).",
    ).tag(config=True)
    notify_timeout = Float(
        30.0, help="Seconds an async notify_hook may take before it is abandoned (logged)."
    ).tag(config=True)
    authenticate_prometheus = Bool(
        True,
        help="The /metrics endpoint needs a token with read:metrics (or the pool's admin "
        "scope), like JupyterHub's own authenticate_prometheus. False serves it to anyone who "
        "can reach the service.",
    ).tag(config=True)

    @default("ip")
    def _ip(self) -> str:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).hostname if url else None) or "127.0.0.1"

    @default("port")
    def _port(self) -> int:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).port or 80) if url else 10101

    @default("on_kubernetes")
    def _default_on_kubernetes(self) -> bool:
        # sim and nvml read one machine's GPUs (a demo that happens to run in a pod)
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        return in_pod and self.telemetry_source == "agents"

    @default("node_name")
    def _node_name(self) -> str:
        return socket.gethostname()

    @default("base_url")
    def _base_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpupool/")

    @default("cookie_secret")
    def _cookie_secret(self) -> str:
        return os.environ.get("GPUPOOL_COOKIE_SECRET", "")

    @validate("cookie_secret")
    def _check_cookie_secret(self, proposal: dict[str, Any]) -> str:
        value: str = proposal["value"].strip()
        try:
            key = bytes.fromhex(value)
        except ValueError:
            raise TraitError(
                "cookie_secret must be hexadecimal (e.g. openssl rand -hex 32)"
            ) from None
        if value and len(key) < 32:
            raise TraitError(f"cookie_secret is {len(key)} bytes; use at least 32")
        return value

    @default("hub_api_url")
    def _hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("hub_spawners")
    def _hub_spawners(self) -> list[str]:
        return [f"{os.environ.get('JUPYTERHUB_SERVICE_NAME', 'gpupool')}-spawner"]

    def initialize(self, argv: list[str] | None = None) -> None:
        """After the shared start (:class:`StrictCommandLine`), open the database, load the pool."""
        super().initialize(argv)
        self.catalog = default_catalog()
        try:
            engine = make_engine(self.db_url)
        except MissingExtra as e:
            raise SystemExit(f"PoolService.db_url: {e}") from None
        try:
            prepare_schema(
                engine, self.db_url, upgrade=self.upgrade_db, wait=self.schema_wait, log=self.log
            )
        except SchemaError as e:
            raise SystemExit(str(e)) from None
        self.store = self.make_store(engine)
        if self.pool_config_file:
            try:
                self.store.load_config(
                    load_pool_config(
                        self.pool_config_file, self.catalog, kubernetes=self.on_kubernetes
                    )
                )
            except PoolError as e:
                raise SystemExit(f"pool config: {e}") from None
        self.metrics = PoolMetrics()
        self.store.listeners.append(self.metrics.on_event)
        self.writer = self.make_writer()
        self.writer.observe_batch = self.metrics.observe_batch
        self.leader = LeaderLock(engine)
        #: re-partitions of Kubernetes nodes through nvidia.com/mig.config (c.MigLabeller)
        self.mig_labeller = MigLabeller(parent=self)
        #: GPUs pods the pool did not place hold, read from the Kubernetes API (c.KubeOccupancy)
        self.occupancy = KubeOccupancy(parent=self)
        self.kube_sharing = KubeSharing(parent=self)  # nodes' time-slicing (c.KubeSharing)
        #: the Kueue AdmissionCheck controller (c.KueueAdmission)
        self.kueue = KueueAdmission(parent=self)
        self.kube_jobs = KubeJobs(parent=self)  # jobs with an image, as Jobs (c.KubeJobs)
        self.utilization = UtilizationBuffer(self.utilization_window)
        self.minutes = MinuteAggregator()
        self.telemetry = self.make_telemetry()
        # the singleton: the stock oauth_callback handler completes logins on HubOAuth.instance(),
        # so the page that begins them and the API that identifies tokens share it
        self.hub_auth = HubOAuth.instance(
            api_url=self.hub_api_url,
            cache_max_age=60,
            oauth_redirect_uri=url_path_join(self.base_url, "oauth_callback"),
        )
        self.hub = HubClient(self.hub_api_url, self.hub_auth.api_token)
        try:
            hook = resolve_hook(self.notify_hook)
        except (ImportError, ValueError) as e:
            raise SystemExit(f"PoolService.notify_hook: {e}") from None
        self.notifier = Notifier(hook, self.notify_timeout, self.log)
        name = os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpupool")
        self.deadlines = NoticeDeadlines(
            self.store,
            self.hub,
            self.writer.run,
            after=self.notice_enforce_after,
            stop_timeout=self.notice_stop_timeout,
            actor=f"service:{name}",
            log=self.log,
        )
        try:
            self.alert_config = PoolAlerts(parent=self)
        except TraitError as e:
            raise SystemExit(f"jupyterhub-gpupool service: error: {e}") from None
        self.alerts = AlertMonitor(
            self.store,
            self.writer.run,
            self.notifier,
            self.metrics,
            self.alert_config.thresholds(),
            leader=self.leader.held,
            actor=f"service:{name}",
            log=self.log,
        )

    def make_writer(self) -> Writer:
        """The batch writer ``decisions`` asks for (started with the service)."""
        mode = self.decisions
        if mode == "auto":
            mode = "process" if self.store.engine.dialect.name == "postgresql" else "thread"
        if mode == "thread":
            return BatchWriter(self.store)
        return ProcessBatchWriter(self.store, self.db_url, self.store_options())

    def make_store(self, engine: Engine) -> Store:
        """The service's store on ``engine``: the writer every state change goes through.

        The seam for a launcher that subclasses the service to run it on another clock (the
        end-to-end tests move the store's ``clock=``, which every decision, lease time and
        notice is taken from). With ``decisions = process`` the decisions are made by a store
        the child process builds from :meth:`store_options` on the real clock, so such a
        launcher runs ``decisions = thread``.
        """
        return Store(engine, self.catalog, **self.store_options())

    def store_options(self) -> dict[str, Any]:
        """The ``Store`` settings from this configuration (the service's and its child's)."""
        return {
            "grant_timeout": self.grant_timeout,
            "aging_interval": self.aging_interval,
            "reserve_after": self.reserve_after,
            "mig_attempts": self.mig_attempts,
            "max_requests_per_user": self.request_cap(),
            "reclaim_stale_after": self.reclaim_stale_after,
            "reclaim_claim_timeout": self.reclaim_claim_timeout,
            "dra_dynamic_mig": tuple(MigLabeller(parent=self).dra_dynamic_mig),
            "job_runner_timeout": self.job_runner_timeout,
            "kernel_rules": KernelRules(
                self.kernel_idle_timeout, self.kernel_notice, self.kernel_report_timeout
            ),
        }

    def request_cap(self) -> int:
        """``max_requests_per_user`` as the store applies it (0: no cap)."""
        if self.max_requests_per_user < 0:
            return 0
        if self.max_requests_per_user > 0:
            return self.max_requests_per_user
        try:
            named = int(os.environ.get("GPUPOOL_NAMED_SERVER_LIMIT", "0"))
        except ValueError:
            named = 0
        return 2 * (named + 1) if named > 0 else 10

    def make_telemetry(self) -> LocalTelemetry | None:
        """The in-process telemetry of ``telemetry_source`` (None: agents post instead)."""
        if self.telemetry_source == "agents":
            return None
        defaults: dict[str, dict[str, Any]] = {}
        if self.telemetry_source == "sim":
            if not self.pool_config_file:
                raise SystemExit("telemetry_source = sim needs pool_config_file (the pool YAML)")
            readers, defaults = sim_nodes(self.pool_config_file, self.catalog)
        else:
            readers = {self.node_name: nvml_reader(self.dynamic_mig)}
        self.log.info(
            "Telemetry in-process (%s): %s every %gs",
            self.telemetry_source,
            ", ".join(readers),
            self.sample_interval,
        )
        return LocalTelemetry(
            readers,
            self.store,
            self.writer,
            self.utilization,
            self.minutes,
            busy_threshold=self.busy_threshold,
            interval=self.sample_interval,
            defaults=lambda name: defaults.get(name, {}),
        )

    def make_flusher(self) -> MinuteFlusher:
        """The minute aggregates' way into the database (``service/minutes.py``)."""
        return MinuteFlusher(
            self.minutes,
            self.writer.run,
            self.store.clock,
            interval=self.utilization_flush_interval,
            retention_days=self.utilization_retention_days,
            log=self.log,
            sample_window=self.utilization_window,
        )

    def make_app(self) -> web.Application:
        """The tornado application with every route of the API."""
        return web.Application(
            routes(self.base_url),
            store=self.store,
            hub_auth=self.hub_auth,
            hub=self.hub,
            check_user_servers=self.check_user_servers,
            hub_spawners=frozenset(self.hub_spawners),
            authenticate_prometheus=self.authenticate_prometheus,
            metrics=self.metrics,
            utilization=self.utilization,
            minutes=self.minutes,
            writer=self.writer,
            health=self.health,
            restarts=Restarts(
                self.store, self.hub, poll=self.restart_poll, log=self.log, writer=self.writer
            ),
            notify=self.notifier
            or Notifier(resolve_hook(self.notify_hook), self.notify_timeout, self.log),
            busy_threshold=self.busy_threshold,
            alerts=getattr(self, "alerts", None),
            telemetry=getattr(self, "telemetry", None),
            pages_prefix=url_path_join(self.base_url, ""),
            cookie_secret=bytes.fromhex(self.cookie_secret) or os.urandom(32),
            xsrf_cookies=False,
            log_function=self._log_request,
        )

    def health(self) -> tuple[bool, dict[str, Any]]:
        """The health check's answer: the loop's lateness and the writer's owed answers."""
        progress = self.writer.progress
        return health(
            "writer",
            progress.stalled_for(),
            self._loop_watch().lag,
            self.health_stall_after,
            outstanding=progress.outstanding,
        )

    def _loop_watch(self) -> LoopWatch:
        if self.loop_watch is None:
            self.loop_watch = LoopWatch()
        return self.loop_watch

    def _log_request(self, handler: web.RequestHandler) -> None:
        status = handler.get_status()
        level = logging.INFO if status < 400 else logging.WARNING
        if status < 300 and handler.request.method == "GET":
            level = logging.DEBUG
        self.log.log(
            level,
            "%d %s %s %.1fms",
            status,
            handler.request.method,
            redact(handler.request.uri or ""),
            1000 * handler.request.request_time(),
        )

    async def reconcile(self, *, periodic: bool = False) -> None:
        """Release leases whose servers are gone (logged and audited). At start every such
        lease made before the service started goes (``stopped``: it stopped while the pool was
        away) — not one a spawner asked for since, whose server the hub may not list yet (the
        hub itself may still be starting); the periodic reconcile takes only those older than
        ``orphan_after`` (``orphaned``). Only the pool's own hub's leases: another hub's
        (``hub_spawners``) are not that hub's to list."""
        try:
            running = await self.hub.running_servers()
            deleted = await self.deleted_servers()
            if periodic:
                older = self.store.clock() - timedelta(seconds=self.orphan_after)
                released = await self.writer.run(
                    commands.Reconcile(
                        running,
                        reason="orphaned",
                        older_than=older,
                        deleted=deleted,
                    )
                )
            else:  # leases made since the service started were made while it watched
                released = await self.writer.run(
                    commands.Reconcile(running, older_than=self._started_at, deleted=deleted)
                )
        except Exception as e:  # the hub may be starting; never stop the service over it
            self.log.warning("Could not reconcile leases with the hub yet: %s", e)
            return
        self._reconciled = True
        self._reconciled_at = asyncio.get_running_loop().time()
        if released or not periodic:
            self.log.info("Reconciled leases with the hub: %d released", released)

    async def deleted_servers(self) -> set[tuple[str, str]]:
        """(user, server) of requests awaiting approval whose server (or user) the pool's own
        hub no longer has: deleted while the request waited, which no spawner's stop reports
        (a server waiting for approval is not running). One hub lookup per such user."""
        waiting = {(a.user, a.server) for a in self.store.awaiting_approval() if a.hub is None}
        deleted: set[tuple[str, str]] = set()
        for user in sorted({u for u, _ in waiting}):
            names = await self.hub.server_names(user)
            deleted |= {k for k in waiting if k[0] == user and (names is None or k[1] not in names)}
        return deleted

    def reconcile_due(self, now: float) -> bool:
        """Whether the periodic reconcile should run at loop time ``now``."""
        interval = self.reconcile_interval
        return interval > 0 and now - self._reconciled_at >= interval

    async def budget_step(self) -> list[BudgetWarningView]:
        """Budgets: warnings at 80 % and 100 % (to the notify_hook, once per level and period);
        a spent ``stop`` budget's running leases get a notice. Returns the new warnings."""
        warnings: list[BudgetWarningView] = await self.writer.run(
            commands.BudgetRound(self.budget_warn_before)
        )
        if not warnings:
            return warnings
        if self.notifier is None:
            self.notifier = Notifier(resolve_hook(self.notify_hook), self.notify_timeout, self.log)
        for w in warnings:
            self.notifier("budget-warning", {"id": "", w.subject: w.name}, **budget_warning_json(w))
        return warnings

    async def housekeeping(self) -> None:
        """Expire unbound grants and serve the queue (aging changes its order over time).

        Only the leading replica does it (safe on every replica, since each step runs under the
        pool lock, but redundant). Both go through the writer like the handlers' decisions: off
        the event loop, and (decisions = process) in the process that decides anyway, which
        then has nothing to catch up with.
        """
        if not self.leader.held():
            return
        try:
            expired, promoted = await asyncio.gather(  # queued in order: one batch
                self.writer.run(commands.ExpireGrants()), self.writer.run(commands.Promote())
            )
            await self.writer.run(commands.PreemptJobs())  # training jobs in someone's way
            await self.writer.run(commands.ReapKernels())  # GPU kernels gone or idle
            # re-partitions nothing is in the way of any more run; finished ones close
            await self.writer.run(commands.AdvanceRepartitions())
            # approved time running out: a notice first, then the lease ends (lapsed)
            await self.writer.run(commands.LapseApprovals())
            await self.budget_step()
            if self.mig_labeller.enabled:  # Kubernetes nodes: through mig-manager's label
                await self.mig_labeller.step(self.store, self.writer.run)
            if self.occupancy.enabled:  # Kubernetes: what pods outside the pool hold
                for node, holds in (await self.occupancy.step(self.store, self.writer.run)).items():
                    self.log.info("Node %s: held outside the pool: %s", node, holds["counts"])
            if self.kube_sharing.enabled:  # which nodes' device plugin serves shares
                await self.kube_sharing.step(self.store, self.writer.run)
            if self.kueue.enabled:  # Kueue Workloads admitted on a job lease
                await self.kueue.step(self.store, self.writer.run)
            if self.kube_jobs.enabled:  # jobs submitted with an image: Jobs/Deployments
                await self.kube_jobs.step(self.store, self.writer.run)
            silent: list[str] = []
            if self.agent_timeout > 0:
                since = self.store.clock() - timedelta(seconds=self.agent_timeout)
                silent = await self.writer.run(commands.MarkUnreachable(since))
            await self.deadlines.step()  # overdue admin and drain notices no reclaimer took
        except Exception:
            self.log.exception("Housekeeping failed")
            return
        if expired or promoted:
            self.log.info("Housekeeping: %d grants expired, %d waiters granted", expired, promoted)
        for node in silent:
            self.log.warning(
                "Node %s is unreachable: its agent said nothing for %gs; it takes no new grants",
                node,
                self.agent_timeout,
            )

    async def start_async(self) -> None:
        """Listen, reconcile, run the housekeeping loop until SIGTERM/SIGINT."""
        settle_garbage_collector()
        self.writer.start()
        self._loop_watch().start()
        if isinstance(self.writer, ProcessBatchWriter):
            self.log.info("Allocation decisions run in process %s", self.writer.pid)
        # bodies up to MAX_BODY are parsed; up to 16 times that, the handler answers a JSON 413;
        # beyond, tornado closes the connection without reading it
        self.http_server = HTTPServer(self.make_app(), xheaders=True, max_body_size=16 * MAX_BODY)
        self.http_server.listen(self.port, self.ip)
        self.log.info(
            "GPU pool service listening on http://%s:%d%s", self.ip, self.port, self.base_url
        )
        self._started_at = self.store.clock()
        self._reconciled = not self.reconcile_on_start
        self._reconciled_at = asyncio.get_running_loop().time()
        if not self._reconciled:
            await self.reconcile()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if self.telemetry is not None:
            self.telemetry.start()
        minutes = self.make_flusher()
        flusher = asyncio.ensure_future(minutes.loop(stop))
        if self.alert_config.enabled:
            watcher = asyncio.ensure_future(self.alerts.run(stop, self.alert_config.interval))
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.housekeeping_interval)
            except asyncio.TimeoutError:
                if not self._reconciled:  # the hub was not up at start: try again
                    await self.reconcile()
                elif self.reconcile_due(loop.time()) and self.leader.held():
                    await self.reconcile(periodic=True)
                await self.housekeeping()
        self.http_server.stop()
        self._loop_watch().stop()
        await self.deadlines.close()
        if self.telemetry is not None:
            await self.telemetry.stop()
        await flusher
        if self.alert_config.enabled:
            await watcher
        try:  # what accumulated since the flusher's last round
            await minutes.flush()
        except Exception:
            self.log.exception("Flushing utilization minutes on stop failed")
        await self.close_kube_clients()
        self.writer.stop()
        self.leader.release()
        self.log.info("GPU pool service stopped")

    async def close_kube_clients(self) -> None:
        """Close the Kubernetes API clients the labeller and the cluster readers opened, so a
        stopping service ends its keep-alive connections rather than leaving them to the
        garbage collector (which warns, and cannot await the close)."""
        for part in (
            self.mig_labeller,
            self.occupancy,
            self.kube_sharing,
            self.kueue,
            self.kube_jobs,
        ):
            await part.close()

    def start(self) -> None:
        """Run the service."""
        asyncio.run(self.start_async())


main = PoolService.launch_instance
