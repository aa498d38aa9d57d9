"""In-process telemetry: on a single machine the service reads the GPUs itself, no agents.

With ``telemetry_source = sim`` every node of the pool config gets a reader on the simulated
NVML; with ``nvml`` this machine's GPUs are one node read through real NVML. Each node's loop
reads on a worker thread (NVML calls block) and feeds the very functions the agent endpoints
use (``ingest``, ``node_from_inventory`` + ``store.put_inventory``), so both sources behave
the same; changes go through the service's writer like the handlers'.

Dynamic MIG goes the agent's way too: the node's plan (``store.mig_plan``) is applied through
the same reader's ``apply_mig_plan`` and reported with ``store.mig_results``. A grant or a
release wakes the loops at once, so a planned instance exists within about a second of its
grant instead of at the next sample tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ..pool import commands
from ..pool.catalog import Catalog
from ..pool.errors import PoolError
from ..poolconfig import load_pool_config
from ..store import Store
from ..telemetry.agent import Reader, inventory_hash
from .ingest import ingest, node_from_inventory
from .serialize.mig import mig_plan_json
from .utilization import MinuteAggregator, Sample, UtilizationBuffer, lease_util_pairs
from .writer import Writer

log = logging.getLogger(__name__)


def sim_readers(pool_config_file: str, node_names: list[str]) -> dict[str, Reader]:
    """A reader on the simulated NVML for each named node of the pool YAML."""
    from ..telemetry.agent import sim_reader

    return {name: sim_reader(pool_config_file, name) for name in node_names}


def sim_nodes(
    pool_config_file: str, catalog: Catalog
) -> tuple[dict[str, Reader], dict[str, dict[str, Any]]]:
    """Every node of the pool YAML on the simulated NVML: its reader, and what its inventory
    reports take from the YAML rather than from NVML (cluster, CPU, memory, labels, sharing)."""
    nodes = load_pool_config(pool_config_file, catalog).nodes
    defaults = {
        n.name: {
            "cluster": n.cluster,
            "cpu_milli": n.cpu_milli,
            "memory_mib": n.memory_mib,
            "labels": dict(n.labels),
            "sharing": {g.uuid: g.sharing for g in n.gpus},
        }
        for n in nodes
    }
    return sim_readers(pool_config_file, [n.name for n in nodes]), defaults


def nvml_reader(dynamic_mig: bool) -> Reader:
    """A reader on this machine's real NVML (SystemExit with the reason when unavailable)."""
    from ..telemetry.agent import nvml_reader

    return nvml_reader(dynamic_mig)


def to_samples(raw: list[dict[str, Any]]) -> list[Sample]:
    """Reader samples (trusted: our own reader made them) as buffer samples."""
    return [
        Sample(
            float(s["ts"]),
            s["gpu"],
            s.get("start"),
            None if s.get("util") is None else float(s["util"]),
            int(s.get("memory_used_mib") or 0),
            s.get("processes"),
            lease_util_pairs(s.get("lease_util")),
        )
        for s in raw
    ]


def with_defaults(inventory: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The inventory, completed by what NVML cannot know (from the pool config's node).

    ``defaults`` may carry ``cluster``, ``cpu_milli``, ``memory_mib``, ``labels`` (merged under
    the reader's) and ``sharing`` (GPU uuid → mode, for GPUs the reader gives none).
    """
    extra = dict(defaults)
    sharing = extra.pop("sharing", {})
    labels = {**extra.pop("labels", {}), **inventory.get("labels", {})}
    gpus = [
        g
        if "sharing" in g or g.get("uuid") not in sharing
        else {**g, "sharing": sharing[g["uuid"]]}
        for g in inventory.get("gpus", [])
    ]
    return {**extra, **inventory, "labels": labels, "gpus": gpus}


class LocalTelemetry:
    """One loop per node: inventory on start and when it changes, samples every ``interval``."""

    def __init__(
        self,
        readers: dict[str, Reader],
        store: Store,
        writer: Writer,
        buffer: UtilizationBuffer,
        minutes: MinuteAggregator | None,
        *,
        busy_threshold: float = 5.0,
        interval: float = 5.0,
        inventory_interval: float = 30.0,
        defaults: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self.readers = readers
        self.store = store
        self.writer = writer
        self.buffer = buffer
        self.minutes = minutes
        self.busy_threshold = busy_threshold
        self.interval = interval
        self.inventory_interval = inventory_interval
        self.defaults = defaults or (lambda name: {})
        self.sent: dict[str, str] = {}  # node → hash of the inventory the store accepted
        self.samples = 0
        self.mig_actions = 0
        self._logged: set[tuple[str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start every node's loop on the running event loop."""
        self._loop = asyncio.get_running_loop()
        for name in self.readers:
            self._wake[name] = asyncio.Event()
            self._tasks.append(asyncio.ensure_future(self.run_node(name)))
        self.store.listeners.append(self.on_event)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        """A grant or a release may change a MIG plan: wake the loops (called from any thread,
        inside the deciding transaction; ``store.mig_plan`` waits for its commit)."""
        if kind in ("granted", "released") and self._loop is not None:
            node = data.get("node") if kind == "granted" else None  # a release: any node
            with contextlib.suppress(RuntimeError):  # a closed event loop: nothing to wake
                self._loop.call_soon_threadsafe(self.wake, node)

    def wake(self, name: str | None = None) -> None:
        """Let one node's loop (or every loop) run its MIG step now."""
        for node, event in self._wake.items():
            if name is None or node == name:
                event.set()

    async def stop(self) -> None:
        """Cancel the loops and close the readers."""
        if self.on_event in self.store.listeners:
            self.store.listeners.remove(self.on_event)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for reader in self.readers.values():
            close = getattr(reader, "close", None)
            if close is not None:
                close()

    def simulates(self, name: str) -> bool:
        """Whether node ``name`` is read from the simulated NVML here (the demo)."""
        return hasattr(getattr(self.readers.get(name), "nvml", None), "set_lost")

    def set_lost(self, name: str, gpu: str, lost: bool) -> bool:
        """Make simulated GPU ``gpu`` (uuid) of node ``name`` fall off the bus, or come back
        (False: no such GPU). The node's next inventory reports it unhealthy."""
        machine = self.readers[name].nvml  # type: ignore[attr-defined]  # the demo reader has it (simulates)
        try:
            machine.set_lost(gpu, lost)
        except (KeyError, AssertionError):
            return False
        return True

    def _once(self, name: str, what: str, err: BaseException) -> None:
        key = (name, f"{what}:{type(err).__name__}")
        if key not in self._logged:
            self._logged.add(key)
            log.warning("Telemetry of node %s: %s failed: %s (logged once)", name, what, err)

    async def check_inventory(self, name: str) -> bool:
        """Read the node's inventory; put it into the pool if it changed. True when put."""
        loop = asyncio.get_running_loop()
        reader = self.readers[name]
        try:
            inventory = await loop.run_in_executor(None, reader.inventory)
        except Exception as e:
            self._once(name, "inventory", e)
            return False
        body = with_defaults(inventory, self.defaults(name))
        digest = inventory_hash(body)
        if self.sent.get(name) == digest:
            return False
        try:
            node = node_from_inventory(name, body, self.store.catalog)
            await self.writer.run(commands.PutInventory(node, actor="telemetry"))
        except PoolError as e:
            self._once(name, "inventory", e)
            return False
        self.sent[name] = digest
        log.info("Inventory of %s read in-process (%d GPUs)", name, len(node.gpus))
        return True

    async def collect(self, name: str) -> int:
        """Read the node's samples once and ingest them; returns how many were read."""
        loop = asyncio.get_running_loop()
        try:
            raw = await loop.run_in_executor(None, self.readers[name].samples)
        except Exception as e:
            self._once(name, "samples", e)
            return 0
        samples = to_samples(raw)
        taken: list[Sample] = []
        busy = ingest(self.store, self.buffer, samples, self.busy_threshold, self.minutes, taken)
        await self.writer.run(commands.AddBusy(busy, node=name, samples=tuple(taken)))
        self.samples += len(samples)
        return len(samples)

    async def apply_mig(self, name: str) -> int:
        """Apply the node's MIG plan through its reader, report it, re-read the inventory.

        Returns how many actions were applied. The reader refuses to destroy an instance with
        processes (checked through NVML right before), whatever the plan says.
        """
        apply = getattr(self.readers[name], "apply_mig_plan", None)
        if apply is None:
            return 0
        loop = asyncio.get_running_loop()
        # the reader takes the plan as the agent gets it (``GET nodes/{name}/mig-plan``)
        actions = mig_plan_json(await loop.run_in_executor(None, self.store.mig_plan, name))
        if not actions:
            return 0
        results = await loop.run_in_executor(None, apply, actions)
        report = [{**a, **r} for a, r in zip(actions, results, strict=False)]
        for r in report:
            level = logging.INFO if r.get("ok") else logging.WARNING
            log.log(
                level,
                "MIG %s %s at %s on %s (node %s): %s",
                r["op"],
                r.get("profile"),
                r["start"],
                r["gpu"],
                name,
                "done" if r.get("ok") else r.get("error"),
            )
        await self.writer.run(commands.MigResults(name, report, actor="telemetry"))
        self.mig_actions += len(report)
        await self.check_inventory(name)  # the layout changed: report it now
        return len(report)

    async def run_node(self, name: str) -> None:
        """The node's loop, until cancelled; a failure is logged and the loop goes on.

        Samples every ``interval``, the inventory every ``inventory_interval``, the MIG plan
        at every round and whenever ``wake`` is called.
        """
        loop = asyncio.get_running_loop()
        wake = self._wake.setdefault(name, asyncio.Event())
        next_inventory = next_sample = 0.0
        while True:
            wake.clear()
            now = loop.time()
            try:
                if now >= next_inventory:
                    next_inventory = now + self.inventory_interval
                    await self.check_inventory(name)
                if now >= next_sample:
                    next_sample = now + self.interval
                    await self.collect(name)
                await self.apply_mig(name)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let one node's trouble stop its telemetry
                self._once(name, "loop", e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), max(0.0, next_sample - loop.time()))
