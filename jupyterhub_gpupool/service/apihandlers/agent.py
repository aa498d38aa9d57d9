"""Agent endpoints: a node's inventory and its utilization samples."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ...pool.errors import PoolError
from ...pool.model import SHARING_MODES, Gpu, MigInstance, Node
from ...store import StoreError
from ..utilization import Sample
from .base import MAX_INT, APIError, APIHandler

MAX_BATCH = 10_000
_GPU_FIELDS = {"uuid", "index", "model", "memory_mib", "mig", "sharing", "healthy"}


def _bad(field: str, message: str, allowed: list[Any] | None = None) -> APIError:
    return APIError(422, "invalid_field", f"{field}: {message}", field=field, allowed=allowed)


class InventoryHandler(APIHandler):
    """``PUT nodes/{name}/inventory``: what the node's agent found through NVML."""

    route_name = "inventory"

    def put(self, name: str) -> None:
        assert self.identity is not None
        self.require(self.identity.is_agent, "report inventory")
        body = self.json_body(
            {
                "cluster": (str, False),
                "cpu_milli": (int, False),
                "memory_mib": (int, False),
                "labels": (dict, False),
                "gpus": (list, True),
            }
        )
        catalog = self.store.catalog
        gpus = []
        for i, raw in enumerate(body["gpus"]):
            where = f"gpus[{i}]"
            if not isinstance(raw, dict):
                raise _bad(where, "must be an object")
            unknown = sorted(set(raw) - _GPU_FIELDS)
            if unknown:
                raise _bad(f"{where}.{unknown[0]}", "unknown field", sorted(_GPU_FIELDS))
            uuid, model_name = raw.get("uuid"), raw.get("model")
            if not isinstance(uuid, str) or not uuid or len(uuid) > 64:
                raise _bad(f"{where}.uuid", "must be a non-empty string")
            if any(g.uuid == uuid for g in gpus):
                raise _bad(f"{where}.uuid", "appears twice in this report")
            if not isinstance(model_name, str) or not model_name.strip() or len(model_name) > 64:
                raise _bad(f"{where}.model", "must be the NVML product or catalog name")
            memory = raw.get("memory_mib", 0)
            if (
                isinstance(memory, bool)
                or not isinstance(memory, int)
                or not 0 <= memory <= MAX_INT
            ):
                raise _bad(f"{where}.memory_mib", "must be a whole number ≥ 0")
            model = catalog.model_for_nvml(model_name, memory)
            sharing = raw.get("sharing", "auto")
            if sharing not in SHARING_MODES:
                raise _bad(f"{where}.sharing", "unknown sharing mode", list(SHARING_MODES))
            mig = raw.get("mig") or {}
            if not isinstance(mig, dict):
                raise _bad(f"{where}.mig", "must be an object")
            instances = []
            for j, inst in enumerate(mig.get("instances") or []):
                if not isinstance(inst, dict) or not isinstance(inst.get("start"), int):
                    raise _bad(f"{where}.mig.instances[{j}]", "needs profile and start")
                instances.append(
                    MigInstance(str(inst.get("profile")), inst["start"], inst.get("uuid"))
                )
            index = raw.get("index", i)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_INT:
                raise _bad(f"{where}.index", "must be an integer")
            gpus.append(
                Gpu(
                    uuid,
                    index,
                    model,
                    name,
                    bool(mig.get("enabled")),
                    bool(mig.get("dynamic")),
                    sharing,
                    bool(raw.get("healthy", True)),
                    instances=instances,
                )
            )
        node = Node(
            name,
            body.get("cluster", "default"),
            body.get("cpu_milli", 0),
            body.get("memory_mib", 0),
            gpus,
            labels=body.get("labels", {}),
        )
        try:
            result = self.store.put_inventory(node, actor=self.identity.describe())
        except StoreError:
            raise
        except PoolError as e:
            raise APIError(422, e.code, e.message, field=e.field, allowed=e.allowed) from None
        self.write_json(result)


class SamplesHandler(APIHandler):
    """``POST nodes/{name}/samples``: a batch of utilization samples."""

    route_name = "samples"

    def post(self, name: str) -> None:
        assert self.identity is not None
        self.require(self.identity.is_agent, "report samples")
        body = self.json_body({"samples": (list, True)})
        raw = body["samples"]
        if len(raw) > MAX_BATCH:
            raise _bad("samples", f"at most {MAX_BATCH} samples per batch")
        with self.store.locked() as alloc:  # no decision changes holders meanwhile
            samples = []
            for i, s in enumerate(raw):
                where = f"samples[{i}]"
                if not isinstance(s, dict):
                    raise _bad(where, "must be an object")
                gpu = s.get("gpu")
                if not isinstance(gpu, str) or gpu not in alloc.gpus:
                    raise _bad(f"{where}.gpu", "not a GPU of this pool")
                if alloc.gpus[gpu].node != name:
                    raise _bad(f"{where}.gpu", f"GPU is not on node {name}")
                ts = s.get("ts")
                if isinstance(ts, str):
                    try:
                        ts = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
                    except ValueError:
                        raise _bad(f"{where}.ts", "must be epoch seconds or ISO 8601") from None
                if (
                    isinstance(ts, bool)
                    or not isinstance(ts, (int, float))
                    or not math.isfinite(ts)
                ):
                    raise _bad(f"{where}.ts", "must be epoch seconds or ISO 8601")
                util = s.get("util")
                if util is not None and (
                    isinstance(util, bool)
                    or not isinstance(util, (int, float))
                    or not 0 <= util <= 100
                ):
                    raise _bad(f"{where}.util", "must be a percentage 0–100 or null")
                mem = s.get("memory_used_mib", 0)
                if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
                    raise _bad(f"{where}.memory_used_mib", "must be a whole number ≥ 0")
                start = s.get("start")
                if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
                    raise _bad(f"{where}.start", "must be the MIG instance's start or null")
                samples.append(
                    Sample(float(ts), gpu, start, None if util is None else float(util), mem)
                )
            buffer = self.settings["utilization"]
            threshold = self.settings["busy_threshold"]
            busy: dict[str, float] = {}
            for sample in sorted(samples, key=lambda x: x.ts):
                prev = buffer.previous(sample.gpu, sample.start)
                if buffer.add([sample]) and prev is not None and (sample.util or 0) >= threshold:
                    seconds = min(sample.ts - prev.ts, 60.0)
                    gpu = alloc.gpus[sample.gpu]
                    holders = [gpu.whole_lease] if gpu.whole_lease else list(gpu.shares)
                    if sample.start is not None:
                        holders = [i.lease for i in gpu.instances if i.start == sample.start]
                    for lease in filter(None, holders):
                        busy[lease] = busy.get(lease, 0.0) + seconds / 3600.0
        self.store.add_busy(busy)
        self.write_json({"accepted": len(samples), "busy_leases": len(busy)})


default_handlers = [
    (r"nodes/([^/]+)/inventory", InventoryHandler),
    (r"nodes/([^/]+)/samples", SamplesHandler),
]
