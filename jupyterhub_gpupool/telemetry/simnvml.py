# ruff: noqa: F405  (pynvml's constants, errors and structures come from simnvml_api)
"""A simulated NVML library with pynvml's names, driven by a pool YAML and load patterns.

Why: tests and the demo should run the very code that reads real GPUs. This module exposes the
subset of the pynvml function API the reader uses (same names, parameters, constants and
``NVMLError_*`` classes with the same ``.value`` codes) and follows NVIDIA's rules: MIG
profiles, IDs and placements come from the pool catalog, illegal or overlapping placements
raise ``NVMLError_InsufficientResources``, utilization (per device and per process) is
``NotSupported`` on MIG GPUs and MIG devices, per-process samples exist from Maxwell on and
answer ``NotFound`` when none is newer than the caller's timestamp, GPM exists only on Hopper
and newer, a GPU instance with compute instances or processes cannot be destroyed (``InUse``),
and a lost GPU raises ``NVMLError_GpuIsLost``.
The MIG calls live in ``simmig`` (a mixin of :class:`SimNvml`); names, constants and
structures in ``simnvml_api``.

Use it like the module (``simnvml.configure(yaml_text, node="sim-a100")``, then call
``simnvml.nvmlInit()`` ...), or make independent simulated machines with
``SimNvml.from_yaml(...)``; the instance carries the same functions, constants and classes, so
``NvmlReader(nvml=instance)`` works too. Utilization follows per-GPU or per-MIG-instance load
patterns (``idle``, ``steady``, ``bursty``, ``notebook``) plus those of the simulated
processes on the device (``add_process(..., load=...)``), deterministic for a seed and an
injectable clock. The YAML's per-GPU ``load`` key and top-level ``simulation`` section are read
here (``poolconfig`` reserves them)::

    simulation: {seed: 7, driver_version: "550.54.15"}
    nodes:
      - name: sim-a100
        gpus:
          - model: A100-80GB
            mig: {enabled: true, instances: [{profile: 3g.40gb, start: 0}]}
            load: {pattern: idle, instances: {0: {pattern: steady, level: 70}}}
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..pool.catalog import Catalog, default_catalog
from ..pool.errors import ConfigError
from ..poolconfig import parse_nodes
from .simload import LoadPattern, _parse_gpu_load, parse_load
from .simmig import SimMigMixin
from .simnvml_api import *  # noqa: F403  (pynvml's names: this module stands in for pynvml)
from .simnvml_api import (
    _GPM_MIN_INTERVAL,
    _GPM_SCALE,
    _PROCESS_SAMPLE_PERIOD,
    _PROCESS_UTIL_ARCHITECTURES,
    NVMLError,
    _api,
    _deref,
)
from .simstate import (
    _TDP_W,
    _ComputeInstance,
    _Gpu,
    _GpuInstance,
    _MigDevice,
    _Process,
    _product_name,
    _read_yaml,
)


class SimNvml(SimMigMixin):
    """One simulated machine (one node of a pool YAML), usable in place of the pynvml module.

    The ``nvml*`` methods take the same parameters as pynvml's functions. Methods without the
    ``nvml`` prefix drive the simulation: ``add_process``, ``remove_process``, ``set_lost``,
    ``set_ecc_errors``, ``set_load``, ``set_mig_pending``, ``remove_function``.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        node: str | None = None,
        *,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self._missing: set[str] = set()
        self._init_count = 0
        self.configure(config or {"nodes": []}, node, seed=seed, clock=clock, catalog=catalog)

    @classmethod
    def from_yaml(
        cls,
        source: str | Path,
        node: str | None = None,
        *,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        catalog: Catalog | None = None,
    ) -> SimNvml:
        """A simulated machine from YAML text or a YAML file path."""
        return cls(_read_yaml(source), node, seed=seed, clock=clock, catalog=catalog)

    # -- configuration ------------------------------------------------------------------------

    def configure(
        self,
        config: Mapping[str, Any],
        node: str | None = None,
        *,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        catalog: Catalog | None = None,
    ) -> SimNvml:
        """(Re)build the simulated machine from a pool config mapping; keeps init state."""
        if not isinstance(config, Mapping):
            raise ConfigError("must be a mapping", field="pool config")
        catalog = catalog or default_catalog()
        sim = config.get("simulation") or {}
        if not isinstance(sim, Mapping):
            raise ConfigError("must be a mapping", field="simulation")
        unknown = set(sim) - {"seed", "driver_version"}
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
                field="simulation",
                allowed=["driver_version", "seed"],
            )
        self.seed = int(seed if seed is not None else sim.get("seed", 0))
        self.driver_version = str(sim.get("driver_version", "550.54.15"))
        self.clock = clock or time.time
        self.t0 = self.clock()
        nodes_raw = config.get("nodes") or []
        nodes = parse_nodes(nodes_raw, catalog)
        if node is None:
            chosen = 0 if nodes else None
        else:
            names = [n.name for n in nodes]
            if node not in names:
                raise ConfigError(f"no node {node!r} in the pool", field="node", allowed=names)
            chosen = names.index(node)
        self.node_name = nodes[chosen].name if chosen is not None else ""
        self._gpus: list[_Gpu] = []
        self._next_pid = 1000
        if chosen is None:
            return self
        # the raw GPU entries of the chosen node, expanded by count like parse_nodes does
        raw_entries: list[tuple[Any, str]] = []
        for g, gpu_raw in enumerate(nodes_raw[chosen].get("gpus", []) or []):
            raw_entries += [(gpu_raw, f"nodes[{chosen}].gpus[{g}].load")] * int(
                gpu_raw.get("count", 1)
            )
        for gpu, (gpu_raw, where) in zip(nodes[chosen].gpus, raw_entries, strict=True):
            load, per_instance = _parse_gpu_load(gpu_raw.get("load"), where)
            mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
            memory_mib = int(gpu_raw.get("memory_mib") or gpu.model.memory_gb * 1024)
            sim_gpu = _Gpu(
                gpu.index,
                gpu.uuid,
                gpu.model,
                _product_name(gpu.model),
                memory_mib,
                mode,
                mode,
                load,
                per_instance,
            )
            self._gpus.append(sim_gpu)
            for inst in gpu.instances:
                gi = self._create_gi(sim_gpu, gpu.model.profile(inst.profile), inst.start)
                self._create_ci(gi, gi.profile.compute_slices, inst.uuid)
        return self

    # -- simulation controls ------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the simulation started (the load patterns' time axis)."""
        return self.clock() - self.t0

    def _find(self, target: str | int) -> _Gpu | _ComputeInstance:
        for g in self._gpus:
            if target in (g.uuid, g.index):
                return g
            for gi in g.gis.values():
                for ci in gi.cis.values():
                    if ci.uuid == target:
                        return ci
        raise KeyError(f"no simulated GPU or MIG device {target!r}")

    def add_process(
        self,
        target: str | int,
        used_mib: int = 1024,
        pid: int | None = None,
        *,
        load: str | Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> int:
        """Start a simulated compute process on a GPU (UUID or index) or MIG device (UUID).

        ``load`` is the process's own activity (a load pattern, default idle): it adds to its
        device's utilization and is what per-process samples report. ``environ`` is what
        ``/proc/<pid>/environ`` would show (``process_environ``), e.g. ``GPUPOOL_LEASE_ID``.
        """
        found = self._find(target)
        if pid is None:
            self._next_pid += 1
            pid = self._next_pid
        pattern = parse_load(load, "load") if load is not None else LoadPattern()
        found.processes.append(_Process(pid, used_mib, pattern, dict(environ or {})))
        return pid

    def _processes(self) -> list[_Process]:
        return [
            p
            for g in self._gpus
            for p in [
                *g.processes,
                *(p for gi in g.gis.values() for ci in gi.cis.values() for p in ci.processes),
            ]
        ]

    def set_process_load(self, pid: int, pattern: str | Mapping[str, Any]) -> None:
        """Change what a simulated process computes (its load pattern)."""
        load = parse_load(pattern, "load")
        for p in self._processes():
            if p.pid == pid:
                p.load = load
                return
        raise KeyError(f"no simulated process {pid}")

    def process_environ(self, pid: int) -> dict[str, str] | None:
        """The environment of a simulated process, as ``/proc/<pid>/environ`` would give it to
        the agent (``None``: no such process). The reader attributes processes to leases
        through it when it reads this machine."""
        for p in self._processes():
            if p.pid == pid:
                return dict(p.environ)
        return None

    def remove_process(self, pid: int) -> None:
        """End a simulated process wherever it runs."""
        for g in self._gpus:
            g.processes = [p for p in g.processes if p.pid != pid]
            for gi in g.gis.values():
                for ci in gi.cis.values():
                    ci.processes = [p for p in ci.processes if p.pid != pid]

    def set_lost(self, target: str | int, lost: bool = True) -> None:
        """Mark a GPU as fallen off the bus: every call about it raises GpuIsLost."""
        gpu = self._find(target)
        assert isinstance(gpu, _Gpu), "only whole GPUs get lost"
        gpu.lost = lost

    def set_ecc_errors(self, target: str | int, uncorrected: int) -> None:
        """Set the volatile uncorrected ECC error count of a GPU."""
        gpu = self._find(target)
        assert isinstance(gpu, _Gpu)
        gpu.ecc_uncorrected = uncorrected

    def set_load(self, target: str | int, pattern: str | Mapping[str, Any]) -> None:
        """Change the load pattern of a GPU or of the MIG instance behind a MIG UUID."""
        found = self._find(target)
        load = parse_load(pattern, "load")
        if isinstance(found, _Gpu):
            found.load = load
        else:
            found.gi.load = load
            found.gi.gpu.instance_loads[found.gi.start] = load

    def set_mig_pending(self, target: str | int, mode: int) -> None:
        """Set the pending MIG mode (what a reset would switch to)."""
        gpu = self._find(target)
        assert isinstance(gpu, _Gpu)
        gpu.mig_pending = mode

    def remove_function(self, name: str) -> None:
        """Make an NVML function raise FunctionNotFound, as on a driver without that symbol."""
        self._missing.add(name)

    # -- internals ----------------------------------------------------------------------------

    def _gpu(self, handle: Any) -> _Gpu:
        if isinstance(handle, _MigDevice):
            if handle.ci.destroyed:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            gpu = handle.ci.gi.gpu
        elif isinstance(handle, _Gpu):
            gpu = handle
        else:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _parent(self, handle: Any) -> _Gpu:
        gpu = self._gpu(handle)
        if isinstance(handle, _MigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def _process_util(self, gpu: _Gpu, p: _Process, t: float) -> float:
        return p.load.util(t, self.seed, f"{gpu.uuid}/pid{p.pid}")

    def _util_at(self, gpu: _Gpu, gi: _GpuInstance | None, t: float) -> float:
        """A device's activity: its own load pattern plus its processes' (capped at 100 %)."""
        if gi is not None:
            procs = (p for ci in gi.cis.values() for p in ci.processes)
            own = gi.load.util(t, self.seed, f"{gpu.uuid}/{gi.start}")
            return min(100.0, own + sum(self._process_util(gpu, p, t) for p in procs))
        if gpu.mig_current:
            total = gpu.model.compute_slices or 1
            return sum(
                self._util_at(gpu, g, t) * g.profile.compute_slices / total
                for g in gpu.gis.values()
            )
        own = gpu.load.util(t, self.seed, gpu.uuid)
        return min(100.0, own + sum(self._process_util(gpu, p, t) for p in gpu.processes))

    def _mean_util(self, gpu: _Gpu, gi: _GpuInstance | None, t1: float, t2: float) -> float:
        """Mean activity over [t1, t2], as GPM counters would accumulate it (≤ 600 points)."""
        n = max(1, min(600, int(t2 - t1)))
        step = (t2 - t1) / n
        return sum(self._util_at(gpu, gi, t1 + (i + 0.5) * step) for i in range(n)) / n

    def _used_mib(self, gpu: _Gpu, gi: _GpuInstance | None) -> int:
        t = self.now()
        if gi is not None:
            procs = sum(p.used_mib for ci in gi.cis.values() for p in ci.processes)
            return min(gi.memory_mib, int(gi.load.memory_share(t) * gi.memory_mib) + procs)
        if gpu.mig_current:
            return sum(self._used_mib(gpu, g) for g in gpu.gis.values())
        procs = sum(p.used_mib for p in gpu.processes)
        return min(gpu.memory_mib, int(gpu.load.memory_share(t) * gpu.memory_mib) + procs)

    # -- NVML: library ------------------------------------------------------------------------

    @_api
    def nvmlInit(self) -> None:
        self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    # -- NVML: devices ------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    @_api
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Gpu | _MigDevice:
        key = uuid.decode() if isinstance(uuid, bytes) else uuid
        try:
            found = self._find(key)
        except KeyError:
            raise NVMLError(NVML_ERROR_NOT_FOUND) from None
        if isinstance(found, _Gpu):
            return self._gpu(found)
        self._gpu(found.gi.gpu)
        return _MigDevice(found)

    @_api
    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        if isinstance(handle, _MigDevice):
            return f"{gpu.name} MIG {handle.ci.gi.profile.name}"
        return gpu.name

    @_api
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return handle.ci.uuid if isinstance(handle, _MigDevice) else gpu.uuid

    @_api
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return handle.ci.slot if isinstance(handle, _MigDevice) else gpu.index

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> c_nvmlMemory_t:
        gpu = self._gpu(handle)
        if isinstance(handle, _MigDevice):
            gi = handle.ci.gi
            total, used = gi.memory_mib, self._used_mib(gpu, gi)
        else:
            total, used = gpu.memory_mib, self._used_mib(gpu, None)
        mib = 1024 * 1024
        return c_nvmlMemory_t(total * mib, (total - used) * mib, used * mib)

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu = self._gpu(handle)
        if isinstance(handle, _MigDevice) or gpu.mig_current:
            # nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not supported"
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        util = self._util_at(gpu, None, self.now())
        return c_nvmlUtilization_t(round(util), round(util * 0.6))

    @_api
    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, timeStamp: int
    ) -> list[c_nvmlProcessUtilizationSample_t]:
        """Per-process samples newer than ``timeStamp`` (CPU time, µs), as nvml.h describes them:
        the driver samples every ``_PROCESS_SAMPLE_PERIOD``; one sample per process that had
        non-zero SM utilization in the newest period; ``NotFound`` when there is none newer than
        ``timeStamp``; ``NotSupported`` on MIG (device handles and MIG-enabled GPUs, as for
        device utilization) and before Maxwell."""
        gpu = self._gpu(handle)
        if isinstance(handle, _MigDevice) or gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if gpu.model.architecture not in _PROCESS_UTIL_ARCHITECTURES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        at = math.floor(self.clock() / _PROCESS_SAMPLE_PERIOD) * _PROCESS_SAMPLE_PERIOD
        stamp = round(at * 1_000_000)
        if stamp <= int(timeStamp):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        out = []
        for p in gpu.processes:
            sm = round(self._process_util(gpu, p, at - self.t0))
            if sm > 0:
                sample = c_nvmlProcessUtilizationSample_t(p.pid, stamp, sm, round(sm * 0.6), 0, 0)
                out.append(sample)
        if not out:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return out

    @_api
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[c_nvmlProcessInfo_v3_t]:
        gpu = self._gpu(handle)
        mib = 1024 * 1024
        if isinstance(handle, _MigDevice):
            ci = handle.ci
            return [
                c_nvmlProcessInfo_v3_t(p.pid, p.used_mib * mib, ci.gi.id, ci.id)
                for p in ci.processes
            ]
        out = [c_nvmlProcessInfo_v3_t(p.pid, p.used_mib * mib) for p in gpu.processes]
        for gi in gpu.gis.values():  # aggregate on the parent (as a privileged caller sees it)
            for ci in gi.cis.values():
                out += [
                    c_nvmlProcessInfo_v3_t(p.pid, p.used_mib * mib, gi.id, ci.id)
                    for p in ci.processes
                ]
        return out

    @_api
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._parent(handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(32 + 0.45 * self._util_at(gpu, None, self.now()))

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._parent(handle)
        tdp = _TDP_W.get(gpu.model.name, 300)
        util = self._util_at(gpu, None, self.now())
        return int((0.15 * tdp + 0.85 * tdp * util / 100) * 1000)  # milliwatts

    @_api
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._parent(handle)
        if gpu.model.architecture in ("ada",) and gpu.model.name.startswith("RTX"):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        return 0

    # -- NVML: GPM ----------------------------------------------------------------------------

    @_api
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> c_nvmlGpmSupport_t:
        gpu = self._gpu(device)
        return c_nvmlGpmSupport_t(NVML_GPM_SUPPORT_VERSION, int(gpu.model.gpm_supported))

    @_api
    def nvmlGpmSampleAlloc(self) -> c_nvmlGpmSample_t:
        return c_nvmlGpmSample_t()

    @_api
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        if not isinstance(gpmSample, c_nvmlGpmSample_t) or gpmSample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpmSample.freed = True

    def _fill(self, sample: Any, gpu: _Gpu, gi: _GpuInstance | None) -> None:
        if not isinstance(sample, c_nvmlGpmSample_t) or sample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        t = self.now()
        sample.filled, sample.ts, sample.source = True, t, (gpu, gi)

    @_api
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> None:
        gpu = self._gpu(device)
        if not gpu.model.gpm_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gi = device.ci.gi if isinstance(device, _MigDevice) else None
        self._fill(gpmSample, gpu, gi)

    @_api
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> None:
        gpu = self._parent(device)
        if not gpu.model.gpm_supported or not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gi = gpu.gis.get(gpuInstanceId)
        if gi is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        self._fill(gpmSample, gpu, gi)

    @_api
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        mg = _deref(metricsGet)
        if mg.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s1, s2 = mg.sample1, mg.sample2
        for s in (s1, s2):
            if not isinstance(s, c_nvmlGpmSample_t) or s.freed or not s.filled:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if s1.source[0] is not s2.source[0] or s1.source[1] is not s2.source[1]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if s2.ts - s1.ts < _GPM_MIN_INTERVAL:
            # two samples of one device, ≥ 100 ms apart, or the counters mean nothing
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not 0 < mg.numMetrics <= NVML_GPM_METRIC_MAX:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu, gi = s1.source
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        busy = self._mean_util(gpu, gi, s1.ts, s2.ts)
        for m in mg.metrics[: mg.numMetrics]:
            scale = _GPM_SCALE.get(m.metricId)
            if scale is None:
                m.nvmlReturn, m.value = NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn, m.value = NVML_SUCCESS, min(100.0, max(0.0, busy * scale))
        return mg


# ---------------------------------------------------------------------------------------------
# The module interface: constants, classes and a default machine behind module-level functions

_EXPORTS = {
    k: v
    for k, v in dict(globals()).items()
    if k.startswith(("NVML_", "NVMLError", "c_nvml", "c_metric"))
}
for _name, _value in _EXPORTS.items():
    setattr(SimNvml, _name, _value)

_default = SimNvml()


def configure(
    source: str | Path | Mapping[str, Any],
    node: str | None = None,
    *,
    seed: int | None = None,
    clock: Callable[[], float] | None = None,
    catalog: Catalog | None = None,
) -> SimNvml:
    """Load a pool YAML (text, path or mapping) into the module's simulated machine.

    ``node`` picks the node this machine plays (an agent runs per node); default: the first.
    Returns the machine, whose non-NVML methods (``add_process``, ``set_lost``...) drive it.
    """
    return _default.configure(_read_yaml(source), node, seed=seed, clock=clock, catalog=catalog)


def process_environ(pid: int) -> dict[str, str] | None:
    """The environment of a process of the module's machine (see ``SimNvml.process_environ``)."""
    return _default.process_environ(pid)


def machine() -> SimNvml:
    """The simulated machine behind the module-level functions."""
    return _default


# bound methods keep pynvml's parameter names (checked by tests/unit/test_simnvml_contract.py)
nvmlInit = _default.nvmlInit
nvmlShutdown = _default.nvmlShutdown
nvmlSystemGetDriverVersion = _default.nvmlSystemGetDriverVersion
nvmlDeviceGetCount = _default.nvmlDeviceGetCount
nvmlDeviceGetHandleByIndex = _default.nvmlDeviceGetHandleByIndex
nvmlDeviceGetHandleByUUID = _default.nvmlDeviceGetHandleByUUID
nvmlDeviceGetName = _default.nvmlDeviceGetName
nvmlDeviceGetUUID = _default.nvmlDeviceGetUUID
nvmlDeviceGetIndex = _default.nvmlDeviceGetIndex
nvmlDeviceGetMemoryInfo = _default.nvmlDeviceGetMemoryInfo
nvmlDeviceGetUtilizationRates = _default.nvmlDeviceGetUtilizationRates
nvmlDeviceGetComputeRunningProcesses = _default.nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetProcessUtilization = _default.nvmlDeviceGetProcessUtilization
nvmlDeviceGetTemperature = _default.nvmlDeviceGetTemperature
nvmlDeviceGetPowerUsage = _default.nvmlDeviceGetPowerUsage
nvmlDeviceGetTotalEccErrors = _default.nvmlDeviceGetTotalEccErrors
nvmlDeviceGetMigMode = _default.nvmlDeviceGetMigMode
nvmlDeviceGetMaxMigDeviceCount = _default.nvmlDeviceGetMaxMigDeviceCount
nvmlDeviceGetMigDeviceHandleByIndex = _default.nvmlDeviceGetMigDeviceHandleByIndex
nvmlDeviceIsMigDeviceHandle = _default.nvmlDeviceIsMigDeviceHandle
nvmlDeviceGetGpuInstanceId = _default.nvmlDeviceGetGpuInstanceId
nvmlDeviceGetComputeInstanceId = _default.nvmlDeviceGetComputeInstanceId
nvmlDeviceGetDeviceHandleFromMigDeviceHandle = _default.nvmlDeviceGetDeviceHandleFromMigDeviceHandle
nvmlDeviceGetGpuInstanceProfileInfo = _default.nvmlDeviceGetGpuInstanceProfileInfo
nvmlDeviceGetGpuInstancePossiblePlacements = _default.nvmlDeviceGetGpuInstancePossiblePlacements
nvmlDeviceGetGpuInstanceRemainingCapacity = _default.nvmlDeviceGetGpuInstanceRemainingCapacity
nvmlDeviceCreateGpuInstanceWithPlacement = _default.nvmlDeviceCreateGpuInstanceWithPlacement
nvmlDeviceGetGpuInstances = _default.nvmlDeviceGetGpuInstances
nvmlDeviceGetGpuInstanceById = _default.nvmlDeviceGetGpuInstanceById
nvmlGpuInstanceGetInfo = _default.nvmlGpuInstanceGetInfo
nvmlGpuInstanceGetComputeInstanceProfileInfo = _default.nvmlGpuInstanceGetComputeInstanceProfileInfo
nvmlGpuInstanceCreateComputeInstance = _default.nvmlGpuInstanceCreateComputeInstance
nvmlGpuInstanceGetComputeInstances = _default.nvmlGpuInstanceGetComputeInstances
nvmlGpuInstanceGetComputeInstanceById = _default.nvmlGpuInstanceGetComputeInstanceById
nvmlComputeInstanceGetInfo = _default.nvmlComputeInstanceGetInfo
nvmlComputeInstanceDestroy = _default.nvmlComputeInstanceDestroy
nvmlGpuInstanceDestroy = _default.nvmlGpuInstanceDestroy
nvmlGpmQueryDeviceSupport = _default.nvmlGpmQueryDeviceSupport
nvmlGpmSampleAlloc = _default.nvmlGpmSampleAlloc
nvmlGpmSampleFree = _default.nvmlGpmSampleFree
nvmlGpmSampleGet = _default.nvmlGpmSampleGet
nvmlGpmMigSampleGet = _default.nvmlGpmMigSampleGet
nvmlGpmMetricsGet = _default.nvmlGpmMetricsGet
