"""``jupyterhub-gpupool agent``: one per GPU node, reporting inventory and utilization.

The agent reads the node through a *reader* (real NVML or the simulator, same code path) and
talks to the pool service's agent endpoints:

* ``PUT {api}/nodes/{node}/inventory`` on start and whenever the inventory's hash changes;
* ``POST {api}/nodes/{node}/samples`` with the samples taken every ``interval`` seconds;
* dynamic MIG: the answer to the samples carries the node's MIG plan; the agent applies it
  through NVML (the reader re-checks processes right before destroying anything), reports
  what came of it with ``POST {api}/nodes/{node}/mig-results`` and re-sends its inventory.

The service may be away (restart, network): samples wait in a bounded queue (the oldest are
dropped and counted, so memory never grows without bound) and delivery is retried with capped
exponential backoff and jitter, so a fleet of agents does not hammer a service that is coming
back. A token that is not allowed is logged once, then retried slowly.

The loop (:class:`AgentLoop`) takes its clock, sleep, randomness and HTTP transport as arguments,
so tests drive it without real time or sockets. It calls the service through the pool's one API
client (:class:`~jupyterhub_gpupool.poolclient.PoolClient`), over that transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from traitlets import Bool, Enum, Float, Integer, Unicode, default, validate

from .._version import __version__
from ..poolclient import PoolClient, PoolClientError, PoolRefused, TornadoTransport, Transport
from ..strictcli import StrictCommandLine

MAX_BATCH = 10_000  # the service's own limit per POST (service/apihandlers/agent.py)

log = logging.getLogger(__name__)


class Reader(Protocol):
    """What the agent needs from the hardware (``telemetry.nvml.NvmlReader`` or the simulator)."""

    def inventory(self) -> dict[str, Any]:
        """The body of ``PUT nodes/{name}/inventory``."""
        ...

    def samples(self, now: float | None = None) -> list[dict[str, Any]]:
        """Current samples: ``{gpu, start, ts, util, memory_used_mib}`` each (plus ``processes`` on
        MIG instances and ``lease_util`` on GPUs not in MIG mode)."""
        ...


@dataclass
class AgentStats:
    """Counters the agent logs now and then (and tests and benchmarks read)."""

    sent: int = 0  # samples the service accepted
    dropped: int = 0  # samples discarded because the queue was full
    rejected: int = 0  # samples the service refused (422): never retried
    errors: int = 0  # failed requests (network, 5xx, 401/403)
    read_errors: int = 0  # failed reads of the hardware
    inventories: int = 0  # inventory reports the service accepted
    mig_actions: int = 0  # dynamic-MIG actions applied
    mig_failures: int = 0  # of which failed

    def line(self, queued: int) -> str:
        """One log line's worth."""
        return (
            f"sent={self.sent} queued={queued} dropped={self.dropped} rejected={self.rejected} "
            f"errors={self.errors} read_errors={self.read_errors} inventories={self.inventories} "
            f"mig_actions={self.mig_actions} mig_failures={self.mig_failures}"
        )


def inventory_hash(inventory: dict[str, Any]) -> str:
    """A stable digest of an inventory, so an unchanged one is never re-sent."""
    return hashlib.sha256(json.dumps(inventory, sort_keys=True).encode()).hexdigest()


def _mig_plan(answer: Any) -> list[dict[str, Any]]:
    """The ``mig_plan`` of a samples answer (empty when absent or malformed)."""
    plan = answer.get("mig_plan") if isinstance(answer, dict) else None
    if not isinstance(plan, list):
        return []
    return [a for a in plan if isinstance(a, dict)]


def _message(e: PoolClientError) -> str:
    """The service's error message, with the accepted values where it lists them."""
    allowed = getattr(e, "allowed", None)
    if isinstance(allowed, list) and allowed and str(allowed) not in e.message:
        return f"{e.message} (allowed: {', '.join(map(str, allowed))})"
    return e.message


class AgentLoop:
    """The agent's loop: sample, queue, deliver, back off. No real time or sockets inside."""

    def __init__(
        self,
        reader: Reader,
        transport: Transport,
        api_url: str,
        node: str,
        token: str,
        *,
        interval: float = 5.0,
        flush_interval: float | None = None,
        inventory_interval: float = 30.0,
        max_queue: int = 50_000,
        batch_size: int = 5_000,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        backoff_jitter: float = 0.5,
        denied_retry_interval: float = 60.0,
        stats_interval: float = 300.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        rand: Callable[[], float] = random.random,
        logger: logging.Logger | None = None,
        cluster: str | None = None,
        devices: Any = None,
        devices_interval: float = 15.0,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1–{MAX_BATCH}")
        if max_queue < 1:
            raise ValueError("max_queue must be ≥ 1")
        self.reader = reader
        self.client = PoolClient(api_url, token, transport=transport)
        self.api_url = self.client.api_url
        self.node = node
        #: the cluster the inventory names (None: whatever the reader says, else ``default``)
        self.cluster = cluster
        self.interval = interval
        self.flush_interval = interval if flush_interval is None else flush_interval
        self.inventory_interval = inventory_interval
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.backoff_jitter = backoff_jitter
        self.denied_retry_interval = denied_retry_interval
        self.stats_interval = stats_interval
        self.clock = clock
        self._sleep = sleep
        self.rand = rand
        self.log = logger or log
        self.stats = AgentStats()
        self.queue: deque[dict[str, Any]] = deque()
        self.failures = 0  # consecutive failed requests
        self._stop: asyncio.Event | None = None
        self._inventory: dict[str, Any] | None = None  # read, not yet accepted
        self._inventory_sent: str | None = None  # hash the service accepted
        self._inventory_refused: str | None = None  # hash the service refused (422)
        self._mig_results: list[dict[str, Any]] = []  # applied, not yet reported
        self.can_mig = callable(getattr(reader, "apply_mig_plan", None))
        self._denied_logged = False
        self._away_logged = False
        self._drop_logged = False
        self._reject_logged = False
        self._read_error: str | None = None
        now = clock()
        self.next_sample = now
        self.next_inventory = now
        self.next_send = now
        self.next_stats = now + stats_interval
        #: the pods' real devices (``podresources.PodDevices``; None: not on Kubernetes)
        self.devices = devices
        self.devices_interval = devices_interval
        self.next_devices = now

    # --- timing -----------------------------------------------------------------------------

    def backoff(self, failures: int) -> float:
        """Seconds before retry number ``failures``: doubling, capped, with jitter below the cap.

        Jitter spreads the retries of many agents after a service restart; the cap bounds how
        long delivery lags once the service is back.
        """
        delay: float = min(self.backoff_max, self.backoff_base * 2 ** min(failures - 1, 62))
        return delay * (1.0 - self.backoff_jitter * self.rand())

    def next_wakeup(self) -> float:
        """When something is due next (sample, inventory check, delivery or stats)."""
        due = [self.next_sample, self.next_inventory, self.next_stats]
        if self.devices is not None:
            due.append(self.next_devices)
        if self._to_deliver():
            due.append(self.next_send)
        return min(due)

    def _to_deliver(self) -> bool:
        """Something to send, or a MIG plan to ask for (a reader that can apply one asks at
        every delivery, even without samples: MIG GPUs without instances have none)."""
        return bool(self.queue or self._inventory is not None or self._mig_results or self.can_mig)

    # --- one step ---------------------------------------------------------------------------

    async def step(self) -> float:
        """Do whatever is due now; return the seconds until something is due again."""
        now = self.clock()
        if now >= self.next_inventory:
            self.next_inventory = now + self.inventory_interval
            self.check_inventory()
        if now >= self.next_sample:
            self.next_sample += self.interval
            if self.next_sample <= now:  # slept through ticks (suspend, slow reader): skip them
                self.next_sample = now + self.interval
            self.collect(now)
        if now >= self.next_send and self._to_deliver():
            await self.deliver()
        if self.devices is not None and now >= self.next_devices:
            self.next_devices = now + self.devices_interval
            await self.devices.step(self.post_devices)
        if now >= self.next_stats:
            self.next_stats = now + self.stats_interval
            self.log.info("Agent %s: %s", self.node, self.stats.line(len(self.queue)))
        return max(0.0, self.next_wakeup() - self.clock())

    def check_inventory(self) -> None:
        """Read the inventory; queue it for sending if it differs from what the service has."""
        try:
            inventory = self.reader.inventory()
            if self.cluster is not None:
                inventory = {**inventory, "cluster": self.cluster}
        except Exception as e:
            self._read_failed("inventory", e)
            return
        digest = inventory_hash(inventory)
        if digest != self._inventory_sent and digest != self._inventory_refused:
            self._inventory = inventory

    def collect(self, now: float) -> None:
        """Take one round of samples into the bounded queue (dropping the oldest if full)."""
        try:
            samples = self.reader.samples(now)
        except Exception as e:
            self._read_failed("samples", e)
            return
        self._read_error = None
        self.queue.extend(samples)
        excess = len(self.queue) - self.max_queue
        if excess > 0:
            for _ in range(excess):
                self.queue.popleft()
            self.stats.dropped += excess
            if not self._drop_logged:
                self._drop_logged = True
                self.log.warning(
                    "Sample queue full (%d): dropping the oldest samples until the pool service "
                    "takes them again",
                    self.max_queue,
                )

    def _read_failed(self, what: str, e: Exception) -> None:
        self.stats.read_errors += 1
        text = f"{type(e).__name__}: {e}"
        if text != self._read_error:  # once per distinct error, not once per tick
            self._read_error = text
            self.log.warning("Could not read %s from the GPUs: %s", what, text)

    # --- delivery ---------------------------------------------------------------------------

    async def deliver(self) -> None:
        """Send MIG results and the inventory if pending, then the queued samples in batches,
        oldest first; then apply the MIG plan the service answered with."""
        if self._mig_results and not await self._send_mig_results():
            return
        if self._inventory is not None and not await self._send_inventory():
            return
        plan: list[dict[str, Any]] = []
        ask = self.can_mig  # an empty batch still brings the plan
        while self.queue or ask:
            ask = False
            batch = list(islice(self.queue, self.batch_size))
            status, answer, message = await self._request(
                self.client.post_samples(self.node, batch)
            )
            if status is None or status >= 500 or status in (401, 403, 429):
                return self._failed(status, message)
            for _ in batch:
                self.queue.popleft()
            if status >= 400:
                self.stats.rejected += len(batch)
                self._inventory_sent = None  # the service may have lost this node: resend it
                self.log.log(
                    logging.DEBUG if self._reject_logged else logging.WARNING,
                    "The pool service refused %d samples (dropped): %d %s",
                    len(batch),
                    status,
                    message,
                )
                self._reject_logged = True
            else:
                self.stats.sent += len(batch)
                self._reject_logged = False
                plan = _mig_plan(answer)
            self._succeeded()
        self._drop_logged = False
        self.next_send = self.clock() + self.flush_interval
        if plan:
            await self.apply_mig_plan(plan)

    async def _send_inventory(self) -> bool:
        """PUT the pending inventory; False when the service is away (retry later)."""
        inventory = self._inventory
        assert inventory is not None
        status, _, message = await self._request(self.client.put_inventory(self.node, inventory))
        if status is None or status >= 500 or status in (401, 403, 429):
            self._failed(status, message)
            return False
        digest = inventory_hash(inventory)
        if status >= 400:
            self._inventory_refused = digest
            self.log.error(
                "The pool service refused this node's inventory: %d %s (not re-sent until "
                "it changes)",
                status,
                message,
            )
        else:
            self._inventory_sent = digest
            self._inventory_refused = None
            self.stats.inventories += 1
            self.log.info("Inventory of %s sent (%d GPUs)", self.node, len(inventory["gpus"]))
        if self._inventory is inventory:
            self._inventory = None
        self._succeeded()
        return True

    async def _send_mig_results(self) -> bool:
        """POST what became of applied MIG actions; False when the service is away."""
        results = self._mig_results
        status, _, message = await self._request(self.client.post_mig_results(self.node, results))
        if status is None or status >= 500 or status in (401, 403, 429):
            self._failed(status, message)
            return False
        if status >= 400:
            self.log.error(
                "The pool service refused %d MIG results (dropped): %d %s",
                len(results),
                status,
                message,
            )
        self._mig_results = []
        self._succeeded()
        return True

    async def apply_mig_plan(self, plan: list[dict[str, Any]]) -> None:
        """Create and destroy MIG instances as the service planned, report, re-send inventory.

        The reader refuses what it must (processes on an instance, a GPU not dynamic); every
        failure is reported with its NVML error name. The inventory is read again at once, so
        the service sees the new layout without waiting for the next inventory interval.
        """
        apply = getattr(self.reader, "apply_mig_plan", None)
        if apply is None:
            self._read_failed("MIG plan", NotImplementedError("this reader cannot change MIG"))
            return
        try:
            results = apply(plan)
        except Exception as e:
            self._read_failed("MIG plan", e)
            return
        for action, result in zip(plan, results, strict=False):
            self._mig_results.append({**action, **result})
            self.stats.mig_actions += 1
            if result.get("ok"):
                self.log.info(
                    "MIG %s %s at %s on %s: done",
                    action.get("op"),
                    action.get("profile"),
                    action.get("start"),
                    action.get("gpu"),
                )
            else:
                self.stats.mig_failures += 1
                self.log.warning(
                    "MIG %s %s at %s on %s failed: %s",
                    action.get("op"),
                    action.get("profile"),
                    action.get("start"),
                    action.get("gpu"),
                    result.get("error"),
                )
        self._inventory = None  # read before the change: stale
        self.check_inventory()
        if await self._send_mig_results() and self._inventory is not None:
            # check_inventory() set it again; mypy keeps the `= None` above across that call
            await self._send_inventory()  # type: ignore[unreachable]  # see above

    async def post_devices(self, lease: str, devices: list[str]) -> tuple[int | None, bytes]:
        """Tell the pool the devices lease ``lease``'s server really got (``PoolClient.rebind``):
        ``(status, message)``, status None when the pool did not answer."""
        status, _, message = await self._request(self.client.rebind(lease, devices))
        return status, message.encode()

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every request (the token's among them)."""
        return self.client.headers

    @property
    def transport(self) -> Transport:
        """The client's transport (tests swap it on a running loop)."""
        return self.client.transport

    @transport.setter
    def transport(self, transport: Transport) -> None:
        self.client.transport = transport

    async def _request(self, call: Awaitable[Any]) -> tuple[int | None, Any, str]:
        """``(status, answer, message)`` of one call: status None when the service did not
        answer (network down, refused, timed out); 200 for any success."""
        try:
            return 200, await call, ""
        except PoolRefused as e:  # a redirect is a wrong URL: retried like no answer
            return (e.status if e.status >= 400 else None), None, _message(e)
        except PoolClientError as e:  # unavailable: no answer, or 502/503/504
            return (e.status if e.status >= 500 else None), None, _message(e)

    def _failed(self, status: int | None, message: str) -> None:
        self.stats.errors += 1
        self.failures += 1
        if status in (401, 403):
            delay = self.denied_retry_interval
            if not self._denied_logged:
                self._denied_logged = True
                self.log.error(
                    "The agent token is not allowed: %d %s — give it the custom:gpupool:agent "
                    "scope; retrying every %gs",
                    status,
                    message,
                    delay,
                )
        else:
            delay = self.backoff(self.failures)
            what = "unreachable" if status is None else f"answered {status}"
            if not self._away_logged:
                self._away_logged = True
                self.log.warning(
                    "Pool service %s (%s): retrying with backoff up to %gs, keeping up to %d "
                    "samples",
                    what,
                    message,
                    self.backoff_max,
                    self.max_queue,
                )
            else:
                self.log.debug("Pool service still %s; retry in %.1fs", what, delay)
        self.next_send = self.clock() + delay

    def _succeeded(self) -> None:
        if self.failures:
            self.log.info(
                "Pool service reachable again after %d failed attempts (%s)",
                self.failures,
                self.stats.line(len(self.queue)),
            )
        self.failures = 0
        self._denied_logged = self._away_logged = False

    # --- running ----------------------------------------------------------------------------

    async def _default_sleep(self, seconds: float) -> None:
        if self._stop is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def run(
        self, stop: asyncio.Event | None = None, until: Callable[[], bool] | None = None
    ) -> None:
        """Step until ``stop`` is set or ``until()`` is true (tests drive a fake clock this way)."""
        self._stop = stop
        sleep = self._sleep or self._default_sleep
        while not (stop is not None and stop.is_set()) and not (until is not None and until()):
            delay = await self.step()
            await sleep(delay)


# --- the application -------------------------------------------------------------------------


def sim_reader(pool_config: str, node: str) -> Reader:
    """An ``NvmlReader`` over the simulated NVML, driven by a pool YAML (imported lazily).

    GPUs the YAML marks ``mig: {dynamic: true}`` are reported as repartitionable, as
    ``--dynamic-mig`` does on real hardware.
    """
    from ..pool.catalog import default_catalog
    from ..pool.errors import PoolError
    from ..poolconfig import load_pool_config
    from .nvml import NvmlReader
    from .simnvml import SimNvml

    if not pool_config:
        raise SystemExit("--source sim needs --pool-config (a pool YAML with this node)")
    try:
        machine = SimNvml.from_yaml(pool_config, node)
        config = load_pool_config(pool_config, default_catalog())
    except PoolError as e:
        raise SystemExit(f"pool config {pool_config}: {e}") from None
    dynamic = {g.uuid for n in config.nodes if n.name == node for g in n.gpus if g.dynamic_mig}
    return NvmlReader(machine, dynamic_mig=dynamic)


def nvml_reader(dynamic_mig: bool) -> Reader:
    """An ``NvmlReader`` over real NVML (``pip install jupyterhub-gpupool[nvml]``)."""
    from .nvml import NvmlReader, NvmlUnavailable

    try:
        return NvmlReader(None, dynamic_mig=dynamic_mig)
    except NvmlUnavailable as e:
        raise SystemExit(str(e)) from None


class NodeAgent(StrictCommandLine):
    """The node agent: inventory and utilization of one GPU node, sent to the pool service."""

    name = "jupyterhub-gpupool-agent"
    command = "agent"
    version = __version__
    description = "Report this node's GPUs and their utilization to the GPU pool service."

    aliases = {
        "config": "NodeAgent.config_file",
        "service-url": "NodeAgent.service_url",
        "node": "NodeAgent.node",
        "cluster": "NodeAgent.cluster",
        "interval": "NodeAgent.interval",
        "source": "NodeAgent.source",
        "pool-config": "NodeAgent.pool_config_file",
        "api-token": "NodeAgent.api_token",
        "log-level": "Application.log_level",
    }
    flags = {
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log at debug level."),
        "dynamic-mig": (
            {"NodeAgent": {"dynamic_mig": True}},
            "The pool may repartition this node's MIG GPUs.",
        ),
    }

    config_file = Unicode(
        "jupyterhub_gpupool_agent_config.py",
        help="Python config file to load (a missing default file is fine).",
    ).tag(config=True)
    service_url = Unicode(
        help="URL of the pool service, e.g. http://hub:8000/services/gpupool/ (its API is "
        "{service_url}api/v1/; a URL already ending in /api/v1 is used as is), else "
        "$GPUPOOL_SERVICE_URL."
    ).tag(config=True)
    node = Unicode(
        help="This node's name in the pool (must match the name the spawner uses), else "
        "$NODE_NAME (Kubernetes downward API), else the host name."
    ).tag(config=True)
    cluster = Unicode(
        help="The cluster this node belongs to (a DNS label the pool config's `clusters` "
        "lists; an unknown one is refused with the known list), else $GPUPOOL_CLUSTER (the "
        "Helm chart sets it from `cluster`), else `default`."
    ).tag(config=True)
    api_token = Unicode(
        help="Token with the custom:gpupool:agent scope, else $GPUPOOL_AGENT_TOKEN, else "
        "$JUPYTERHUB_API_TOKEN. Prefer the environment: a flag shows in `ps`."
    ).tag(config=True)
    source = Enum(
        ["nvml", "sim"],
        default_value="nvml",
        help="Where GPU data comes from: real NVML (nvidia-ml-py), or the simulated NVML "
        "driven by --pool-config (demos, tests).",
    ).tag(config=True)
    pool_config_file = Unicode(
        "", help="Pool YAML the simulator reads (with --source sim): this node's GPUs and load."
    ).tag(config=True)
    dynamic_mig = Bool(
        False,
        help="Report this node's MIG-enabled GPUs as repartitionable by the pool (dynamic MIG): "
        "the agent then creates and destroys MIG instances as the pool plans (NVML needs root "
        "for it). NVML cannot know it; with --source sim the pool YAML's mig.dynamic decides.",
    ).tag(config=True)
    interval = Float(5.0, help="Seconds between utilization samples.").tag(config=True)
    flush_interval = Float(
        0.0,
        help="Seconds between deliveries of queued samples (0: every sample interval). A longer "
        "one sends fewer, larger batches.",
    ).tag(config=True)
    inventory_interval = Float(
        30.0,
        help="Seconds between inventory reads; the inventory is sent only when it changed "
        "(e.g. after a MIG reconfiguration).",
    ).tag(config=True)
    max_queue = Integer(
        50_000,
        help="Samples kept while the service is away (about 1 h of a node with 8 GPUs × 7 MIG "
        "slices at 5 s); beyond it the oldest are dropped and counted.",
    ).tag(config=True)
    batch_size = Integer(5_000, help=f"Samples per POST (at most {MAX_BATCH}).").tag(config=True)
    backoff_max = Float(
        60.0, help="Longest wait (seconds) between retries while the service is away or failing."
    ).tag(config=True)
    denied_retry_interval = Float(
        60.0, help="Seconds between retries while the service refuses the token (401/403)."
    ).tag(config=True)
    stats_interval = Float(
        300.0, help="Seconds between log lines with the agent's counters (sent, dropped, errors)."
    ).tag(config=True)
    request_timeout = Float(30.0, help="Seconds before a request to the service is abandoned.").tag(
        config=True
    )
    validate_cert = Bool(True, help="Verify the service's TLS certificate.").tag(config=True)
    ca_file = Unicode("", help="CA bundle to verify the service's TLS certificate with.").tag(
        config=True
    )
    pod_resources_socket = Unicode(
        "",
        help="The kubelet's PodResources socket (/var/lib/kubelet/pod-resources/kubelet.sock, "
        "mounted read-only): tell the pool the device each of its servers' pods really got "
        "(the device plugin picks it). Needs grpcio (the kubelet extra) and pods list on the "
        "API server. Empty: off.",
    ).tag(config=True)
    kube_api_host = Unicode(
        "", help="The Kubernetes API server for the node's pods; empty: the pod's own."
    ).tag(config=True)
    devices_interval = Float(
        15.0, help="Seconds between reads of the pods' devices (pod_resources_socket)."
    ).tag(config=True)

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO  # the counters and "service back" lines are INFO: show them

    @default("service_url")
    def _service_url_default(self) -> str:
        return os.environ.get("GPUPOOL_SERVICE_URL", "")

    @default("node")
    def _node_default(self) -> str:
        return os.environ.get("NODE_NAME") or socket.gethostname()

    @default("cluster")
    def _cluster_default(self) -> str:
        return os.environ.get("GPUPOOL_CLUSTER") or "default"

    @default("api_token")
    def _api_token_default(self) -> str:
        return os.environ.get("GPUPOOL_AGENT_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @validate("batch_size")
    def _valid_batch(self, proposal: dict[str, Any]) -> int:
        return max(1, min(MAX_BATCH, int(proposal["value"])))

    @property
    def api_url(self) -> str:
        """The pool API's base URL, ending in ``/``."""
        url = self.service_url.rstrip("/")
        return url + "/" if url.endswith("/api/v1") else url + "/api/v1/"

    def initialize(self, argv: list[str] | None = None) -> None:
        """After the shared start (:class:`StrictCommandLine`), refuse to start without the
        service's URL or a token."""
        super().initialize(argv)
        if not self.service_url:
            raise SystemExit("The agent needs --service-url (or $GPUPOOL_SERVICE_URL)")
        if not self.api_token:
            raise SystemExit(
                "The agent needs a token with the custom:gpupool:agent scope: "
                "$GPUPOOL_AGENT_TOKEN, $JUPYTERHUB_API_TOKEN or --api-token"
            )

    def make_reader(self) -> Reader:
        """The reader for ``--source``."""
        if self.source == "sim":
            return sim_reader(self.pool_config_file, self.node)
        return nvml_reader(self.dynamic_mig)

    def make_loop(self, reader: Reader, transport: Transport | None = None) -> AgentLoop:
        """The loop with this application's settings."""
        return AgentLoop(
            reader,
            transport
            or TornadoTransport(self.request_timeout, self.validate_cert, self.ca_file or None),
            self.api_url,
            self.node,
            self.api_token,
            interval=self.interval,
            flush_interval=self.flush_interval or None,
            inventory_interval=self.inventory_interval,
            max_queue=self.max_queue,
            batch_size=self.batch_size,
            backoff_max=self.backoff_max,
            denied_retry_interval=self.denied_retry_interval,
            stats_interval=self.stats_interval,
            logger=self.log,
            cluster=self.cluster,
            devices=self.make_devices(),
            devices_interval=self.devices_interval,
        )

    def make_devices(self) -> Any:
        """The pods' devices reader, when ``pod_resources_socket`` is set."""
        if not self.pod_resources_socket:
            return None
        from ..kube.client import KubeAPI, KubeClient
        from .podresources import PodDevices, PodResourcesClient

        api = KubeAPI(self.kube_api_host) if self.kube_api_host else KubeAPI.in_cluster()
        kube = KubeClient(api)
        return PodDevices(
            PodResourcesClient(self.pod_resources_socket),
            lambda: kube.list_pods(f"spec.nodeName={self.node}"),
        )

    async def start_async(self) -> None:
        """Run the loop until SIGTERM/SIGINT."""
        loop = self.make_loop(self.make_reader())
        stop = asyncio.Event()
        aio = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.add_signal_handler(sig, stop.set)
        self.log.info(
            "GPU pool agent for node %s (cluster %s) reporting to %s every %gs (source: %s)",
            self.node,
            self.cluster,
            self.api_url,
            self.interval,
            self.source,
        )
        try:
            await loop.run(stop)
        finally:
            close = getattr(loop.reader, "close", None)
            if close is not None:
                close()
        self.log.info("Agent stopped: %s", loop.stats.line(len(loop.queue)))

    def start(self) -> None:
        """Run the agent."""
        asyncio.run(self.start_async())


main = NodeAgent.launch_instance

if __name__ == "__main__":
    main()
