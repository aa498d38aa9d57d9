"""The node agent's view of its GPUs, read only through the pynvml function API.

Why only the function API: the same code must run on real ``pynvml`` (package ``nvidia-ml-py``)
and on ``simnvml``, so tests and the demo exercise what runs on GPUs. Every ``NVMLError`` the
reader can meet is handled: a feature the GPU or driver lacks (``NotSupported``,
``FunctionNotFound``) makes that value unknown (``None``), a GPU that fell off the bus
(``GpuIsLost``) is reported unhealthy, and each kind of failure is logged once.

What is knowable about utilization (see docs/source/explanation/utilization.md): a whole GPU
reports ``nvmlDeviceGetUtilizationRates``; a MIG instance has no utilization on Ampere (util
``None``, memory in use from its MIG handle) and GPM activity on Hopper and newer, computed from
two GPM samples taken at least 100 ms apart (the reader keeps the previous sample per instance
between calls, so an instance's first sample has util ``None``). A GPU not in MIG mode also
gives per-process samples (``nvmlDeviceGetProcessUtilization``, Maxwell and newer): the reader
attributes each active process to the lease whose server started it (``GPUPOOL_LEASE_ID`` in
the process's environment) and reports ``lease_util``, so a share is judged by its own
processes, not by a busy neighbour on the same GPU.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..pool.catalog import Catalog, GpuModel, default_catalog
from ..pool.errors import PoolError

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GPM_MIN_INTERVAL = 0.1  # seconds between the two GPM samples of one reading (nvml.h: > 100 ms)
#: Node label set when a GPU's pending MIG mode differs from the current one (a reset is due).
PENDING_LABEL = "gpupool.jupyter.org/mig-pending.gpu{index}"
DRIVER_LABEL = "gpupool.jupyter.org/nvidia-driver"

#: The server environment variable naming the lease (DESIGN §6): processes a user's server
#: starts (kernels, their children) inherit it, so it ties a GPU process to its lease.
LEASE_ENV = "GPUPOOL_LEASE_ID"
#: A process environment reader: pid → its environment, ``None`` when it cannot be read.
EnvironReader = Callable[[int], Mapping[str, str] | None]

# compute slices → NVML_COMPUTE_INSTANCE_PROFILE_* enum (nvml.h), for full-size compute instances
_CI_ENUM_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: pynvml not installed, libnvidia-ml missing, or no driver."""


class _GpuLost(Exception):
    pass


def proc_environ(pid: int) -> dict[str, str] | None:
    """``/proc/<pid>/environ`` of a process NVML lists (``None`` if gone or not readable).

    NVML gives host PIDs: the agent must see the host's PID namespace (``hostPID`` on
    Kubernetes) and be allowed to read the process's environment (the same user, or root /
    CAP_SYS_PTRACE).
    Where it cannot, processes stay unattributed and shares fall back to the whole GPU.
    """
    try:
        raw = Path(f"/proc/{int(pid)}/environ").read_bytes()
    except (OSError, ValueError):
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def error_name(err: BaseException) -> str:
    """``NVMLError_InUse`` → ``InUse``: the short name reported in results and logs."""
    return type(err).__name__.removeprefix("NVMLError_")


class NvmlReader:
    """Inventory, utilization samples, processes and dynamic-MIG changes for one node.

    ``nvml`` is the pynvml module or anything with its function API (``simnvml``, a
    ``SimNvml`` machine); ``None`` imports ``pynvml``. ``dynamic_mig`` says which MIG-enabled
    GPUs the pool may repartition (``True``: all, or a collection of GPU UUIDs); NVML cannot
    know that, it is the agent's configuration.
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        catalog: Catalog | None = None,
        clock: Callable[[], float] = time.time,
        dynamic_mig: bool | Collection[str] = False,
        environ: EnvironReader | None = None,
    ) -> None:
        if nvml is None:
            try:
                # the real library under the name of the API given (simnvml's, in tests)
                import pynvml as nvml  # type: ignore[no-redef]  # see above
            except ImportError:
                raise NvmlUnavailable(
                    "pynvml is not installed: pip install 'jupyterhub-gpupool[nvml]' "
                    "(package nvidia-ml-py), or use the simulated NVML"
                ) from None
        self.nvml: ModuleType | Any = nvml
        self.catalog = catalog or default_catalog()
        self.clock = clock
        self.dynamic_mig = dynamic_mig
        #: pid → environment; the simulator stands in for /proc for its own processes
        self.environ: EnvironReader = (
            environ or getattr(nvml, "process_environ", None) or proc_environ
        )
        self._proc_seen: dict[str, int] = {}  # GPU → newest per-process sample (µs)
        self._proc_support: dict[str, bool] = {}
        self._logged: set[tuple[str, str]] = set()
        self._known: dict[int, dict[str, Any]] = {}  # index → last inventory entry
        self._gpm: dict[tuple[str, int], tuple[float, Any]] = {}  # (GPU, GI id) → (ts, sample)
        self._gpm_support: dict[str, bool] = {}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML could not start ({error_name(e)}: {e}); is the NVIDIA driver "
                "(libnvidia-ml.so.1) installed and a GPU visible?"
            ) from None

    def close(self) -> None:
        """Free GPM samples and shut NVML down."""
        for _, sample in self._gpm.values():
            self._try("nvmlGpmSampleFree", sample)
        self._gpm.clear()
        self._try("nvmlShutdown")

    # -- calling NVML -------------------------------------------------------------------------

    def _log_once(self, call: str, err: BaseException) -> None:
        key = (call, error_name(err))
        if key not in self._logged:
            self._logged.add(key)
            log.warning("NVML %s failed: %s (%s); logged once", call, error_name(err), err)

    def _call(self, name: str, *args: Any) -> Any:
        """Call an NVML function; a missing symbol is FunctionNotFound, a lost GPU _GpuLost."""
        fn = getattr(self.nvml, name, None)
        if fn is None:
            raise self.nvml.NVMLError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND (old pynvml)
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            if e.value == 15:  # NVML_ERROR_GPU_IS_LOST
                self._log_once(name, e)
                raise _GpuLost from None
            raise

    def _try(self, name: str, *args: Any, default: Any = None) -> Any:
        """Like ``_call`` but any NVML failure except a lost GPU gives ``default`` (logged once)."""
        try:
            return self._call(name, *args)
        except self.nvml.NVMLError as e:
            self._log_once(name, e)
            return default

    def _handles(self) -> Iterable[tuple[int, Any]]:
        """(index, handle) per GPU; handle ``None`` when the GPU is lost."""
        count = self._try("nvmlDeviceGetCount", default=0)
        for index in range(count):
            try:
                yield index, self._call("nvmlDeviceGetHandleByIndex", index)
            except _GpuLost:
                yield index, None
            except self.nvml.NVMLError as e:
                self._log_once("nvmlDeviceGetHandleByIndex", e)

    def _model(self, name: str, memory_mib: int) -> GpuModel:
        return self.catalog.model_for_nvml(name, memory_mib)

    # -- MIG enumeration ----------------------------------------------------------------------

    def _profile_infos(self, handle: Any) -> dict[int, Any]:
        """GPU-instance profile info by profile ID (enum values the GPU does not offer skipped)."""
        infos: dict[int, Any] = {}
        count = getattr(self.nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)
        for enum in range(count):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum)
            except self.nvml.NVMLError as e:
                if e.value not in (2, 3):  # InvalidArgument / NotSupported: not on this GPU
                    self._log_once("nvmlDeviceGetGpuInstanceProfileInfo", e)
                continue
            infos.setdefault(int(info.id), info)
        return infos

    def _gpu_instances(self, handle: Any) -> list[tuple[Any, int, int, Any]]:
        """(GI handle, GI id, start, profile info) for every GPU instance, CI or not."""
        out = []
        for pid, info in self._profile_infos(handle).items():
            n = int(info.instanceCount)
            if n <= 0:
                continue
            array = (self.nvml.c_nvmlGpuInstance_t * n)()
            count = ctypes.c_uint(n)
            try:
                self._call("nvmlDeviceGetGpuInstances", handle, pid, array, ctypes.byref(count))
            except self.nvml.NVMLError as e:
                self._log_once("nvmlDeviceGetGpuInstances", e)
                continue
            for i in range(count.value):
                gi_info = self._call("nvmlGpuInstanceGetInfo", array[i])
                out.append((array[i], int(gi_info.id), int(gi_info.placement.start), info))
        return sorted(out, key=lambda x: x[2])

    def _mig_devices(self, handle: Any) -> list[tuple[Any, int, str]]:
        """(MIG handle, GI id, MIG UUID) per MIG device (compute instance)."""
        out = []
        for i in range(self._try("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            except self.nvml.NVMLError as e:
                if e.value != 6:  # NotFound: an empty slot
                    self._log_once("nvmlDeviceGetMigDeviceHandleByIndex", e)
                continue
            gi_id = self._call("nvmlDeviceGetGpuInstanceId", mig)
            out.append((mig, int(gi_id), _text(self._call("nvmlDeviceGetUUID", mig))))
        return out

    def _profile_name(self, model: GpuModel, info: Any) -> str:
        for p in model.profiles.values():
            if p.id == int(info.id):
                return p.name
        return _text(info.name).removeprefix("MIG ").strip() or f"profile-{int(info.id)}"

    def _mig_mode(self, handle: Any) -> tuple[int, int]:
        try:
            current, pending = self._call("nvmlDeviceGetMigMode", handle)
        except self.nvml.NVMLError as e:
            if e.value != 3:  # NotSupported: not a MIG GPU, nothing to log
                self._log_once("nvmlDeviceGetMigMode", e)
            return 0, 0
        return int(current), int(pending)

    # -- inventory ----------------------------------------------------------------------------

    def _is_dynamic(self, uuid: str) -> bool:
        if isinstance(self.dynamic_mig, bool):
            return self.dynamic_mig
        return uuid in self.dynamic_mig

    def _inventory_gpu(self, index: int, handle: Any, labels: dict[str, str]) -> dict[str, Any]:
        uuid = _text(self._call("nvmlDeviceGetUUID", handle))
        name = _text(self._call("nvmlDeviceGetName", handle))
        mem = self._try("nvmlDeviceGetMemoryInfo", handle)
        memory_mib = int(mem.total) // MIB if mem is not None else 0
        model = self._model(name, memory_mib)
        current, pending = self._mig_mode(handle)
        if current != pending:
            labels[PENDING_LABEL.format(index=index)] = "enabled" if pending else "disabled"
        instances = []
        if current:
            mig_uuids: dict[int, str] = {}
            procs: dict[int, int | None] = {}
            for mig, gi_id, mig_uuid in self._mig_devices(handle):
                mig_uuids.setdefault(gi_id, mig_uuid)
                running = self._try("nvmlDeviceGetComputeRunningProcesses", mig)
                counted = procs.get(gi_id, 0)
                procs[gi_id] = (
                    None if running is None or counted is None else counted + len(running)
                )
            for _, gi_id, start, info in self._gpu_instances(handle):
                instances.append(
                    {
                        "profile": self._profile_name(model, info),
                        "start": start,
                        "uuid": mig_uuids.get(gi_id),
                        "processes": procs.get(gi_id, 0),
                    }
                )
        ecc = self._try(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            getattr(self.nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(self.nvml, "NVML_VOLATILE_ECC", 0),
        )
        return {
            "uuid": uuid,
            "index": index,
            "model": name,
            "memory_mib": memory_mib,
            "mig": {
                "enabled": bool(current),
                "dynamic": bool(current) and self._is_dynamic(uuid),
                "instances": instances,
            },
            "healthy": not ecc,
        }

    def inventory(self) -> dict[str, Any]:
        """The body of ``PUT nodes/{name}/inventory``: GPUs, MIG layouts and health.

        ``model`` is NVML's product name (the service maps it to the catalog). MIG ``instances``
        list every GPU instance with its catalog profile name, start and MIG UUID (``None`` for
        a GPU instance without compute instance). A GPU is unhealthy when lost or when it has
        volatile uncorrected ECC errors; a lost GPU seen before is reported with its last
        known facts. ``labels`` carry the driver version and, per GPU whose pending MIG mode
        differs from the current one, ``PENDING_LABEL`` (a reset is due).
        """
        labels: dict[str, str] = {}
        driver = self._try("nvmlSystemGetDriverVersion")
        if driver:
            labels[DRIVER_LABEL] = _text(driver)
        gpus = []
        for index, handle in self._handles():
            try:
                if handle is None:
                    raise _GpuLost
                entry = self._inventory_gpu(index, handle, labels)
                self._known[index] = entry
            except _GpuLost:
                known = self._known.get(index)
                if known is None:
                    log.error("GPU %d is lost before it was ever seen; not reported", index)
                    continue
                entry = {**known, "healthy": False}
            gpus.append(entry)
        return {"labels": labels, "gpus": gpus}

    def health(self) -> list[dict[str, Any]]:
        """Per GPU: lost, ECC errors, temperature (°C) and power (W), ``None`` where unknown."""
        out = []
        for index, handle in self._handles():
            row: dict[str, Any] = {
                "index": index,
                "uuid": self._known.get(index, {}).get("uuid"),
                "lost": handle is None,
            }
            try:
                if handle is None:
                    raise _GpuLost
                row["uuid"] = _text(self._call("nvmlDeviceGetUUID", handle))
                row["temperature_c"] = self._try(
                    "nvmlDeviceGetTemperature",
                    handle,
                    getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0),
                )
                power = self._try("nvmlDeviceGetPowerUsage", handle)
                row["power_w"] = None if power is None else power / 1000
                row["ecc_uncorrected"] = self._try(
                    "nvmlDeviceGetTotalEccErrors",
                    handle,
                    getattr(self.nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                    getattr(self.nvml, "NVML_VOLATILE_ECC", 0),
                )
            except _GpuLost:
                row.update(lost=True, temperature_c=None, power_w=None, ecc_uncorrected=None)
            row["healthy"] = not row["lost"] and not row.get("ecc_uncorrected")
            out.append(row)
        return out

    # -- samples ------------------------------------------------------------------------------

    def _gpm_ok(self, uuid: str, handle: Any) -> bool:
        if uuid not in self._gpm_support:
            support = self._try("nvmlGpmQueryDeviceSupport", handle)
            self._gpm_support[uuid] = bool(support is not None and support.isSupportedDevice)
        return self._gpm_support[uuid]

    def _gpm_util(self, uuid: str, handle: Any, gi_id: int, ts: float) -> float | None:
        """Activity % of a GPU instance since the previous call (GPM), else ``None``."""
        sample = self._try("nvmlGpmSampleAlloc")
        if sample is None:
            return None
        try:
            self._call("nvmlGpmMigSampleGet", handle, gi_id, sample)
        except self.nvml.NVMLError as e:
            self._log_once("nvmlGpmMigSampleGet", e)
            self._try("nvmlGpmSampleFree", sample)
            if e.value in (3, 13):  # NotSupported / FunctionNotFound: stop asking
                self._gpm_support[uuid] = False
            return None
        key = (uuid, gi_id)
        prev = self._gpm.get(key)
        if prev is None or ts - prev[0] < GPM_MIN_INTERVAL:
            if prev is None:
                self._gpm[key] = (ts, sample)
            else:  # too close: keep the older sample so the next interval is long enough
                self._try("nvmlGpmSampleFree", sample)
            return None
        mg = self.nvml.c_nvmlGpmMetricsGet_t()
        mg.version = getattr(self.nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = 1
        mg.sample1, mg.sample2 = prev[1], sample
        mg.metrics[0].metricId = getattr(self.nvml, "NVML_GPM_METRIC_GRAPHICS_UTIL", 1)
        util = None
        try:
            self._call("nvmlGpmMetricsGet", mg)
        except self.nvml.NVMLError as e:
            self._log_once("nvmlGpmMetricsGet", e)
        else:
            if int(mg.metrics[0].nvmlReturn) == 0:
                util = round(min(100.0, max(0.0, float(mg.metrics[0].value))), 2)
        self._try("nvmlGpmSampleFree", prev[1])
        self._gpm[key] = (ts, sample)
        return util

    def _lease_util(
        self, uuid: str, handle: Any, device_util: float | None
    ) -> dict[str, float] | None:
        """SM utilization by lease of a GPU not in MIG mode, from per-process samples.

        ``{lease: %}``: the sum over the lease's processes that NVML sampled since the previous
        call (capped at 100), and 0 for a lease with processes that had no activity; a lease
        without process on the GPU is absent (0 %). ``None`` where the GPU gives no
        per-process samples (MIG, before Maxwell, an old driver: asked once, then not again)
        or where an active process belongs to no lease the agent can tell (its environment
        is unreadable or has no ``GPUPOOL_LEASE_ID``), or where the GPU reports activity
        (``device_util`` above 0) that no process sample explains: then shares are judged by
        the whole GPU.
        """
        if not self._proc_support.get(uuid, True):
            return None
        last = self._proc_seen.get(uuid, 0)
        try:
            samples = list(self._call("nvmlDeviceGetProcessUtilization", handle, last))
        except self.nvml.NVMLError as e:
            # NotFound: no process active since ``last``. pynvml raises NVMLError(SUCCESS) when
            # the sizing call succeeds with nothing to size (no sample either).
            if e.value not in (0, 6):
                self._log_once("nvmlDeviceGetProcessUtilization", e)
                if e.value in (3, 13):  # NotSupported / FunctionNotFound: stop asking
                    self._proc_support[uuid] = False
                return None
            samples = []
        if samples:  # the next reading asks for what is newer
            self._proc_seen[uuid] = max(last, *(int(s.timeStamp) for s in samples))
        running = self._try("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) or []
        util: dict[str, float] = {}
        for p in running:
            lease = self._lease_of(int(p.pid))
            if lease is not None:
                util.setdefault(lease, 0.0)
        newest: dict[int, Any] = {}
        for s in samples:
            if int(s.pid) not in newest or int(s.timeStamp) > int(newest[int(s.pid)].timeStamp):
                newest[int(s.pid)] = s
        for pid, s in newest.items():
            if int(s.smUtil) <= 0:
                continue
            lease = self._lease_of(pid)
            if lease is None:
                key = ("unattributed", uuid)
                if key not in self._logged:
                    self._logged.add(key)
                    log.warning(
                        "GPU %s: active process %d belongs to no lease this agent can tell "
                        "(environment unreadable or without %s); shares on it are judged by "
                        "the whole GPU's utilization; logged once",
                        uuid,
                        pid,
                        LEASE_ENV,
                    )
                return None
            util[lease] = min(100.0, util.get(lease, 0.0) + float(s.smUtil))
        if device_util and not any(int(s.smUtil) > 0 for s in newest.values()):
            return None  # busy, but no process sample says whose: never read as idle
        return util

    def _lease_of(self, pid: int) -> str | None:
        env = self.environ(pid)
        lease = env.get(LEASE_ENV) if env else None
        return lease or None

    def samples(self, now: float | None = None) -> list[dict[str, Any]]:
        """The body's ``samples`` for ``POST nodes/{name}/samples``: one per GPU or MIG instance.

        Whole GPUs: ``nvmlDeviceGetUtilizationRates``, and ``lease_util`` (utilization by
        lease from per-process samples, see ``_lease_util``; ``None`` where unknown). MIG
        instances (``start`` set): memory in
        use from the MIG handle, the compute processes running on it (``processes``: the idle
        signal of a MIG slice without GPM) and, on Hopper and newer, GPM activity since the
        previous call; ``util`` is ``None`` where it is not knowable (Ampere MIG, first GPM
        reading), as is ``processes`` where NVML does not say. Lost GPUs give no samples.
        """
        ts = self.clock() if now is None else now
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, int]] = set()
        for _, handle in self._handles():
            if handle is None:
                continue
            try:
                uuid = _text(self._call("nvmlDeviceGetUUID", handle))
                current, _ = self._mig_mode(handle)
                if not current:
                    util = self._try("nvmlDeviceGetUtilizationRates", handle)
                    mem = self._try("nvmlDeviceGetMemoryInfo", handle)
                    out.append(
                        {
                            "gpu": uuid,
                            "start": None,
                            "ts": ts,
                            "util": None if util is None else float(util.gpu),
                            "memory_used_mib": int(mem.used) // MIB if mem is not None else 0,
                            "lease_util": self._lease_util(
                                uuid, handle, None if util is None else float(util.gpu)
                            ),
                        }
                    )
                    continue
                starts = {gi_id: start for _, gi_id, start, _ in self._gpu_instances(handle)}
                gpm = self._gpm_ok(uuid, handle)
                done: set[int] = set()
                for mig, gi_id, _ in self._mig_devices(handle):
                    if gi_id in done or gi_id not in starts:
                        continue
                    done.add(gi_id)
                    seen.add((uuid, gi_id))
                    mem = self._try("nvmlDeviceGetMemoryInfo", mig)
                    procs = self._try("nvmlDeviceGetComputeRunningProcesses", mig)
                    out.append(
                        {
                            "gpu": uuid,
                            "start": starts[gi_id],
                            "ts": ts,
                            "util": self._gpm_util(uuid, handle, gi_id, ts) if gpm else None,
                            "memory_used_mib": int(mem.used) // MIB if mem is not None else 0,
                            "processes": None if procs is None else len(procs),
                        }
                    )
            except _GpuLost:
                continue
        for key in [k for k in self._gpm if k not in seen]:  # instances that went away
            self._try("nvmlGpmSampleFree", self._gpm.pop(key)[1])
        return out

    # -- processes ----------------------------------------------------------------------------

    def processes(self) -> list[dict[str, Any]]:
        """Compute processes per GPU and per MIG instance (``start`` and ``mig_uuid`` set)."""
        out: list[dict[str, Any]] = []
        for _, handle in self._handles():
            if handle is None:
                continue
            try:
                uuid = _text(self._call("nvmlDeviceGetUUID", handle))
                current, _ = self._mig_mode(handle)
                targets: list[tuple[Any, int | None, str | None]] = [(handle, None, None)]
                if current:
                    starts = {g: s for _, g, s, _ in self._gpu_instances(handle)}
                    targets = [(m, starts.get(g), u) for m, g, u in self._mig_devices(handle)]
                for h, start, mig_uuid in targets:
                    for p in self._try("nvmlDeviceGetComputeRunningProcesses", h, default=[]):
                        used = getattr(p, "usedGpuMemory", None)
                        out.append(
                            {
                                "gpu": uuid,
                                "start": start,
                                "mig_uuid": mig_uuid,
                                "pid": int(p.pid),
                                "memory_used_mib": None if used is None else int(used) // MIB,
                            }
                        )
            except _GpuLost:
                continue
        return out

    # -- dynamic MIG --------------------------------------------------------------------------

    def apply_mig_plan(self, actions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Create or destroy GPU instances the service planned; one result per action.

        ``{"op": "create", "gpu": uuid, "profile": name, "start": n}`` creates the GPU
        instance at that placement plus one compute instance spanning it (one MIG device);
        ``{"op": "destroy", "gpu": uuid, "start": n}`` destroys its compute instances and the
        GPU instance, refusing (``InUse``) while processes run on it: checked through NVML right
        before, whatever the plan said. Results are ``{"ok", "error", "mig_uuid"}`` where
        ``error`` is the NVML error name (``InUse``, ``InsufficientResources``,
        ``NotSupported``...) or ``NotFound``/``UnknownProfile``/``InvalidAction``, or
        ``NotDynamic`` for a MIG GPU this reader was not told the pool may repartition.
        Creating an instance that is already there (same profile and start) succeeds with its
        uuid, so a plan applied twice changes nothing. Never changes the MIG mode.
        """
        results = []
        for action in actions:
            try:
                results.append(self._apply(action))
            except _GpuLost:
                results.append(_result(False, "GpuIsLost"))
            except self.nvml.NVMLError as e:
                self._log_once(f"apply_mig_plan {action.get('op')}", e)
                results.append(_result(False, error_name(e)))
        return results

    def _apply(self, action: Mapping[str, Any]) -> dict[str, Any]:
        op, gpu, start = action.get("op"), action.get("gpu"), action.get("start")
        if (
            op not in ("create", "destroy")
            or not isinstance(gpu, str)
            or not isinstance(start, int)
        ):
            return _result(False, "InvalidAction")
        try:
            handle = self._call("nvmlDeviceGetHandleByUUID", gpu)
        except self.nvml.NVMLError as e:
            return _result(False, error_name(e))
        if self._mig_mode(handle)[0] and not self._is_dynamic(gpu):
            return _result(False, "NotDynamic")
        if op == "create":
            return self._create(handle, str(action.get("profile")), start)
        return self._destroy(handle, start)

    def _create(self, handle: Any, profile_name: str, start: int) -> dict[str, Any]:
        name = _text(self._call("nvmlDeviceGetName", handle))
        mem = self._call("nvmlDeviceGetMemoryInfo", handle)
        model = self._model(name, int(mem.total) // MIB)
        try:
            profile = model.profile(profile_name)
        except PoolError:
            return _result(False, "UnknownProfile")
        if profile.id is None:
            return _result(False, "UnknownProfile")
        for _, gi_id, s, info in self._gpu_instances(handle):
            if s == start and int(info.id) == profile.id:  # made already (a plan applied twice)
                uuid = next((u for _, g, u in self._mig_devices(handle) if g == gi_id), None)
                if uuid is not None:
                    return _result(True, None, uuid)
        placement = self.nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, profile.memory_slices
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            handle,
            profile.id,
            ctypes.byref(placement),
        )
        try:
            ci_enum = _CI_ENUM_FOR_SLICES[profile.compute_slices]
            ci_info = self._call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                ci_enum,
                getattr(self.nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
            )
            self._call("nvmlGpuInstanceCreateComputeInstance", gi, int(ci_info.id))
        except (self.nvml.NVMLError, KeyError) as e:
            self._try("nvmlGpuInstanceDestroy", gi)  # roll back: no MIG device without a CI
            name = error_name(e) if isinstance(e, self.nvml.NVMLError) else "NotSupported"
            return _result(False, name)
        gi_id = int(self._call("nvmlGpuInstanceGetInfo", gi).id)
        mig_uuid = next((u for _, g, u in self._mig_devices(handle) if g == gi_id), None)
        return _result(True, None, mig_uuid)

    def _destroy(self, handle: Any, start: int) -> dict[str, Any]:
        found = [(gi, gi_id) for gi, gi_id, s, _ in self._gpu_instances(handle) if s == start]
        if not found:
            return _result(False, "NotFound")
        gi, gi_id = found[0]
        migs = [m for m, g, _ in self._mig_devices(handle) if g == gi_id]
        for mig in migs:
            if self._call("nvmlDeviceGetComputeRunningProcesses", mig):
                return _result(False, "InUse")
        for mig in migs:
            ci_id = self._call("nvmlDeviceGetComputeInstanceId", mig)
            ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
            self._call("nvmlComputeInstanceDestroy", ci)
        self._call("nvmlGpuInstanceDestroy", gi)
        return _result(True, None)


def _result(ok: bool, error: str | None, mig_uuid: str | None = None) -> dict[str, Any]:
    return {"ok": ok, "error": error, "mig_uuid": mig_uuid}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
