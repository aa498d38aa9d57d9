"""Telemetry ingestion shared by the agent endpoints and the in-process telemetry loop.

Why one path: samples and inventories posted by node agents and those read in-process
(``telemetry_source = sim | nvml``) must feed the same buffer, minute aggregates, busy hours
and inventory rows, so the two sources can never drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from ..pool.catalog import Catalog
from ..pool.errors import ConfigError
from ..pool.idlesignal import GpuSample
from ..pool.model import SHARING_MODES, Gpu, MigInstance, Node
from ..pool.usage import MAX_INTERVAL, UsageFacts, add_interval, busy_evidence
from ..store import Store
from .utilization import MinuteAggregator, Sample, UtilizationBuffer

MAX_INT = 2**31 - 1
MAX_STR = 255
MAX_LABELS = 256
#: More instances than any GPU can hold (seven on the largest MIG GPUs) is not a report.
MAX_INSTANCES = 16
GPU_FIELDS = {"uuid", "index", "model", "memory_mib", "mig", "sharing", "healthy"}
MIG_FIELDS = {"enabled", "dynamic", "instances"}
INSTANCE_FIELDS = {"profile", "start", "uuid", "processes"}


class InventoryError(ConfigError):
    """A malformed GPU entry in an inventory report; ``detail`` is ``"field: message"``."""

    code = "invalid_field"

    def __init__(self, field: str, message: str, allowed: list[Any] | None = None) -> None:
        super().__init__(message, field=field, allowed=allowed)
        self.detail = f"{field}: {message}"


def _bad(field: str, message: str, allowed: list[Any] | None = None) -> InventoryError:
    return InventoryError(field, message, allowed)


def _instance(inst: Any, where: str) -> MigInstance:
    """One reported MIG instance, checked field by field."""
    if not isinstance(inst, dict):
        raise _bad(where, "must be an object")
    unknown = sorted(set(inst) - INSTANCE_FIELDS)
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", "unknown field", sorted(INSTANCE_FIELDS))
    profile, start, uuid = inst.get("profile"), inst.get("start"), inst.get("uuid")
    if not isinstance(profile, str) or not 0 < len(profile) <= 32:
        raise _bad(f"{where}.profile", "must be a MIG profile name (1–32 characters)")
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < 64:
        raise _bad(f"{where}.start", "must be the placement start (0–63)")
    if uuid is not None and (not isinstance(uuid, str) or not 0 < len(uuid) <= 64):
        raise _bad(f"{where}.uuid", "must be a MIG-… uuid (1–64 characters) or null")
    procs = inst.get("processes")
    if procs is not None and (
        isinstance(procs, bool) or not isinstance(procs, int) or not 0 <= procs <= MAX_INT
    ):
        raise _bad(f"{where}.processes", "must be a count ≥ 0 or null")
    return MigInstance(profile, start, uuid, None, procs)


def node_from_inventory(name: str, body: Mapping[str, Any], catalog: Catalog) -> Node:
    """A pool ``Node`` from an inventory report (the body of ``PUT nodes/{name}/inventory``).

    Raises ``InventoryError`` (naming the field) for a malformed GPU entry, ``ConfigError`` for
    an unknown model;
    the top-level fields' types are the caller's to check.
    """
    gpus: list[Gpu] = []
    for i, raw in enumerate(body["gpus"]):
        where = f"gpus[{i}]"
        if not isinstance(raw, dict):
            raise _bad(where, "must be an object")
        unknown = sorted(set(raw) - GPU_FIELDS)
        if unknown:
            raise _bad(f"{where}.{unknown[0]}", "unknown field", sorted(GPU_FIELDS))
        uuid, model_name = raw.get("uuid"), raw.get("model")
        if not isinstance(uuid, str) or not uuid or len(uuid) > 64:
            raise _bad(f"{where}.uuid", "must be a string of 1–64 characters")
        if any(g.uuid == uuid for g in gpus):
            raise _bad(f"{where}.uuid", "appears twice in this report")
        if not isinstance(model_name, str) or not model_name.strip() or len(model_name) > 64:
            raise _bad(f"{where}.model", "must be the NVML product or catalog name")
        if not isinstance(raw.get("healthy", True), bool):
            raise _bad(f"{where}.healthy", "must be true or false")
        memory = raw.get("memory_mib", 0)
        if isinstance(memory, bool) or not isinstance(memory, int) or not 0 <= memory <= MAX_INT:
            raise _bad(f"{where}.memory_mib", "must be a whole number ≥ 0")
        model = catalog.model_for_nvml(model_name, memory)
        sharing = raw.get("sharing", "auto")
        if sharing not in SHARING_MODES:
            raise _bad(f"{where}.sharing", "unknown sharing mode", list(SHARING_MODES))
        mig = raw.get("mig")
        mig = {} if mig is None else mig  # null is "no MIG"; 0, "" or [] are not objects
        if not isinstance(mig, dict):
            raise _bad(f"{where}.mig", "must be an object")
        unknown = sorted(set(mig) - MIG_FIELDS)
        if unknown:
            raise _bad(f"{where}.mig.{unknown[0]}", "unknown field", sorted(MIG_FIELDS))
        for flag in ("enabled", "dynamic"):
            if not isinstance(mig.get(flag, False), bool):
                raise _bad(f"{where}.mig.{flag}", "must be true or false")
        raw_instances = mig.get("instances")
        raw_instances = [] if raw_instances is None else raw_instances
        if not isinstance(raw_instances, list):
            raise _bad(f"{where}.mig.instances", "must be a list")
        if len(raw_instances) > MAX_INSTANCES:
            raise _bad(f"{where}.mig.instances", f"at most {MAX_INSTANCES} instances")
        instances = [
            _instance(inst, f"{where}.mig.instances[{j}]") for j, inst in enumerate(raw_instances)
        ]
        index = raw.get("index", i)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_INT:
            raise _bad(f"{where}.index", "must be an integer")
        if any(g.index == index for g in gpus):  # NVML numbers a node's GPUs 0, 1, 2, …
            raise _bad(f"{where}.index", f"GPU index {index} appears twice on this node")
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
    labels = body.get("labels", {})
    if len(labels) > MAX_LABELS:
        raise _bad("labels", f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not isinstance(value, str) or not 0 < len(key) <= MAX_STR or len(value) > MAX_STR:
            raise _bad(f"labels.{key[:64]}", f"keys and values must be strings of ≤ {MAX_STR}")
    return Node(
        name,
        body.get("cluster", "default"),
        body.get("cpu_milli", 0),
        body.get("memory_mib", 0),
        gpus,
        labels=body.get("labels", {}),
    )


def ingest(
    store: Store,
    buffer: UtilizationBuffer,
    samples: Iterable[Sample],
    busy_threshold: float,
    minutes: MinuteAggregator | None = None,
    taken: list[Sample] | None = None,
) -> UsageFacts:
    """Feed trusted samples to the live buffer, the minute aggregates and busy time.

    A sample counts once (the buffer drops duplicates and out-of-order retries); those it took
    are appended to ``taken``, for the caller to store for the reclaim rounds (``AddBusy``'s
    ``samples``, in the same write as the busy time). A busy sample
    (``pool.usage.busy_evidence``: utilization at or above ``busy_threshold``, or on MIG without
    utilization a process or memory held, *estimated*) adds the time since the device's
    previous sample (at most a minute) to the hours it falls in, for the leases holding the
    device, divided by the lease's devices (each GPU of a multi-GPU lease counts once). On a
    shared GPU with per-process figures (``lease_util``) only the shares whose own processes
    are busy get it; without them, every share (the whole GPU's reading). Returns the busy time
    per (lease, hour), for the caller to record through the writer (``Store.add_busy``).
    """
    facts: UsageFacts = {}
    ordered = sorted(samples, key=lambda x: x.ts)
    # where each device's stored samples end, whichever replica took them: the interval is
    # counted from there, and a sample another replica already took is not counted again
    stored = store.latest_sample_times({(s.gpu, s.start) for s in ordered})
    busy: list[tuple[Sample, float, bool]] = []  # a busy sample, its seconds, estimated
    for sample in ordered:
        device = (sample.gpu, sample.start)
        before = buffer.previous(sample.gpu, sample.start)
        elsewhere = stored.get(device)
        if not buffer.add([sample]):
            continue
        if elsewhere is not None and elsewhere >= sample.ts:
            continue  # stored already (posted to another replica too): counted there
        stored[device] = sample.ts
        prev_ts = max(
            (t for t in (before.ts if before else None, elsewhere) if t is not None),
            default=None,
        )
        if taken is not None:
            taken.append(sample)
        if minutes is not None:
            minutes.add(sample)
        if prev_ts is None:
            continue
        evidence = busy_evidence(
            GpuSample(sample.ts, sample.util, sample.memory_used_mib, sample.processes),
            busy_threshold,
        )
        if evidence is not None:
            seconds = min(sample.ts - prev_ts, MAX_INTERVAL)
            busy.append((sample, seconds, evidence == "estimated"))
    if not busy:
        return facts
    # the holders of the busy samples' GPUs, read in one locked call: one consistent state, so
    # no decision changes holders between two samples of the batch
    pool = store.gpu_holders({s.gpu for s, _, _ in busy}, fresh=False)
    lease_devices = pool.lease_devices
    for sample, seconds, estimated in busy:
        gpu = sample.gpu  # a GPU the pool does not know has no holders
        if sample.start is not None:
            holders = [le for start, le in pool.instances.get(gpu, ()) if start == sample.start]
        elif gpu in pool.whole:
            holders = [pool.whole[gpu]]
        elif sample.lease_util is not None:
            # a share is busy by its own processes, as the reclaimer judges it: a busy
            # neighbour does not make an idle share's held hours busy ones
            own = dict(sample.lease_util)
            shares = pool.shares.get(gpu, ())
            holders = [le for le in shares if own.get(le, 0.0) >= busy_threshold]
        else:
            holders = list(pool.shares.get(gpu, ()))
        end = minute_time(sample.ts)
        for lease in holders:
            add_interval(facts, lease, end, seconds, 1.0 / lease_devices.get(lease, 1), estimated)
    return facts


def minute_time(ts: float) -> datetime:
    """An epoch timestamp as a naive UTC datetime (the store's time)."""
    return datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None)
