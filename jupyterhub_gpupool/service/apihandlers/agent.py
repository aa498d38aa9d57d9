"""Agent endpoints: a node's inventory, its utilization samples and its dynamic-MIG plan.

The plan rides on the answer to every samples batch (``mig_plan``), so an agent learns of it
within one delivery interval without asking; ``GET nodes/{name}/mig-plan`` shows the same to
tools and admins. The agent reports what it did with ``POST nodes/{name}/mig-results``.
"""

from __future__ import annotations

import math
from typing import Any

from ...pool import commands
from ...timeparse import parse_time
from ..ingest import InventoryError, ingest, node_from_inventory
from ..serialize.mig import mig_plan_json
from ..serialize.nodes import node_json
from ..utilization import Sample, lease_util_pairs
from .base import MAX_STR, APIError, APIHandler, needs

MAX_BATCH = 10_000
MAX_RESULTS = 1_000
#: A GPU's memory, at most (1 TiB): an unknown model's size is kept in tenths of a GB, which
#: rounds the largest 32-bit MiB counts past what the database's column holds.
MAX_GPU_MEMORY_MIB = 1024 * 1024


#: Leases a sample's ``lease_util`` may name (shares of one GPU: far fewer in practice).
MAX_LEASES_PER_GPU = 64


def _lease_util(raw: object, where: str) -> tuple[tuple[str, float], ...] | None:
    """A sample's ``lease_util`` (lease id → utilization %, or null), checked."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(where, "must map lease ids to percentages 0–100, or be null")
    if len(raw) > MAX_LEASES_PER_GPU:
        raise _bad(where, f"at most {MAX_LEASES_PER_GPU} leases")
    for lease, value in raw.items():
        if not lease or len(lease) > MAX_STR:
            raise _bad(where, f"lease ids are 1–{MAX_STR} characters")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise _bad(f"{where}.{lease}", "must be a percentage 0–100")
    return lease_util_pairs(raw)


def _bad(field: str, message: str, allowed: list[Any] | None = None) -> APIError:
    return APIError("invalid_field", f"{field}: {message}", field=field, allowed=allowed)


class InventoryHandler(APIHandler):
    """``PUT nodes/{name}/inventory``: what the node's agent found through NVML."""

    route_name = "inventory"

    @needs("agent", "report inventory")
    async def put(self, name: str) -> None:
        body = self.json_body(
            {
                "cluster": (str, False),
                "cpu_milli": (int, False),
                "memory_mib": (int, False),
                "labels": (dict, False),
                "gpus": (list, True),
            }
        )
        if not 0 < len(name) <= MAX_STR:
            raise _bad("name", f"a node name has 1–{MAX_STR} characters")
        for key in ("cpu_milli", "memory_mib"):
            if body.get(key, 0) < 0:
                raise _bad(key, "must be a whole number ≥ 0")
        for i, gpu in enumerate(body["gpus"]):
            memory = gpu.get("memory_mib") if isinstance(gpu, dict) else None
            if isinstance(memory, int) and memory > MAX_GPU_MEMORY_MIB:
                raise _bad(f"gpus[{i}].memory_mib", f"at most {MAX_GPU_MEMORY_MIB} MiB")
        try:
            node = node_from_inventory(name, body, self.store.catalog)
        except InventoryError as e:
            raise APIError("invalid_field", e.detail, field=e.field, allowed=e.allowed) from None
        actor = self.identity.describe()
        self.write_json(node_json(await self.writer.run(commands.PutInventory(node, actor=actor))))


class SamplesHandler(APIHandler):
    """``POST nodes/{name}/samples``: a batch of utilization samples."""

    route_name = "samples"

    @needs("agent", "report samples")
    async def post(self, name: str) -> None:
        body = self.json_body({"samples": (list, True)})
        raw = body["samples"]
        if len(raw) > MAX_BATCH:
            raise _bad("samples", f"at most {MAX_BATCH} samples per batch")
        named = {s["gpu"] for s in raw if isinstance(s, dict) and isinstance(s.get("gpu"), str)}
        known = self.store.gpu_nodes(named, fresh=False).nodes  # the GPUs, to check the batch
        if len(known) < len(named):
            # a GPU the view does not know yet may have come with an inventory just committed
            # by the store process (an agent's first samples follow its inventory at once)
            known = self.store.gpu_nodes(named, fresh=True).nodes
        samples = []
        for i, s in enumerate(raw):
            where = f"samples[{i}]"
            if not isinstance(s, dict):
                raise _bad(where, "must be an object")
            gpu = s.get("gpu")
            if not isinstance(gpu, str) or gpu not in known:
                raise _bad(f"{where}.gpu", "not a GPU of this pool")
            if known[gpu] != name:
                raise _bad(f"{where}.gpu", f"GPU is not on node {name}")
            ts = s.get("ts")
            if isinstance(ts, str):
                try:
                    moment = parse_time(ts)
                except ValueError:
                    moment = None
                if moment is None:
                    raise _bad(f"{where}.ts", "must be epoch seconds or ISO 8601")
                ts = moment.timestamp()
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
                raise _bad(f"{where}.ts", "must be epoch seconds or ISO 8601")
            util = s.get("util")
            if util is not None and (
                isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 100
            ):
                raise _bad(f"{where}.util", "must be a percentage 0–100 or null")
            mem = s.get("memory_used_mib", 0)
            if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
                raise _bad(f"{where}.memory_used_mib", "must be a whole number ≥ 0")
            start = s.get("start")
            if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
                raise _bad(f"{where}.start", "must be the MIG instance's start or null")
            procs = s.get("processes")
            if procs is not None and (
                isinstance(procs, bool) or not isinstance(procs, int) or procs < 0
            ):
                raise _bad(f"{where}.processes", "must be a count ≥ 0 or null")
            lease_util = _lease_util(s.get("lease_util"), f"{where}.lease_util")
            samples.append(
                Sample(
                    float(ts),
                    gpu,
                    start,
                    None if util is None else float(util),
                    mem,
                    procs,
                    lease_util,
                )
            )
        taken: list[Sample] = []
        busy = ingest(
            self.store,
            self.settings["utilization"],
            samples,
            self.settings["busy_threshold"],
            self.settings["minutes"],
            taken,
        )
        # committed before the answer: every replica's next reclaim round sees these samples
        await self.writer.run(commands.AddBusy(busy, node=name, samples=tuple(taken)))
        self.write_json(
            {
                "accepted": len(samples),
                "busy_leases": len({lease for lease, _ in busy}),
                "mig_plan": mig_plan_json(self.store.mig_plan(name)),
            }
        )


class MigPlanHandler(APIHandler):
    """``GET nodes/{name}/mig-plan``: the MIG instances the node should create or destroy."""

    route_name = "mig-plan"

    @needs("agent", "read MIG plans")
    def get(self, name: str) -> None:
        self.write_json({"node": name, "actions": mig_plan_json(self.store.mig_plan(name))})


class MigResultsHandler(APIHandler):
    """``POST nodes/{name}/mig-results``: what the node's agent did with its MIG plan."""

    route_name = "mig-results"

    @needs("agent", "report MIG results")
    async def post(self, name: str) -> None:
        body = self.json_body({"results": (list, True)})
        raw = body["results"]
        if len(raw) > MAX_RESULTS:
            raise _bad("results", f"at most {MAX_RESULTS} results per report")
        results = []
        for i, r in enumerate(raw):
            where = f"results[{i}]"
            if not isinstance(r, dict):
                raise _bad(where, "must be an object")
            if r.get("op") not in ("create", "destroy"):
                raise _bad(f"{where}.op", "unknown operation", ["create", "destroy"])
            for key, size in (("gpu", 64), ("profile", 32)):
                if not isinstance(r.get(key), str) or not 0 < len(r[key]) <= size:
                    raise _bad(f"{where}.{key}", f"must be a string of 1–{size} characters")
            start = r.get("start")
            if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < 64:
                raise _bad(f"{where}.start", "must be the placement start (0–63)")
            if not isinstance(r.get("ok"), bool):
                raise _bad(f"{where}.ok", "must be true or false")
            for key in ("error", "mig_uuid"):
                value = r.get(key)
                if value is not None and (not isinstance(value, str) or len(value) > 64):
                    raise _bad(f"{where}.{key}", "must be a string (at most 64 characters) or null")
            results.append(r)
        actor = self.identity.describe()
        self.write_json(await self.writer.run(commands.MigResults(name, results, actor=actor)))


default_handlers = [
    (r"nodes/([^/]+)/inventory", InventoryHandler),
    (r"nodes/([^/]+)/samples", SamplesHandler),
    (r"nodes/([^/]+)/mig-plan", MigPlanHandler),
    (r"nodes/([^/]+)/mig-results", MigResultsHandler),
]
