"""The state of one simulated machine (GPUs, MIG GPU and compute instances, processes) and the
small helpers ``simnvml`` builds it with: what the simulated NVML reports is read from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..pool.catalog import GpuModel, MigProfile
from ..pool.errors import ConfigError
from ..pool.miglayout import mig_new_starts
from .simload import LoadPattern


@dataclass
class _Process:
    pid: int
    used_mib: int
    #: the process's own SM activity (per-process samples; added to its device's utilization)
    load: LoadPattern = field(default_factory=LoadPattern)
    #: what ``/proc/<pid>/environ`` would hold (the pool's server environment, for one)
    environ: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class _ComputeInstance:
    gi: _GpuInstance
    id: int
    profile_id: int
    slices: int
    slot: int  # MIG device index (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    processes: list[_Process] = field(default_factory=list)
    destroyed: bool = False


@dataclass(eq=False)
class _GpuInstance:
    gpu: _Gpu
    id: int
    profile: MigProfile
    start: int
    load: LoadPattern
    cis: dict[int, _ComputeInstance] = field(default_factory=dict)
    destroyed: bool = False

    @property
    def memory_mib(self) -> int:
        p, m = self.profile, self.gpu.model
        if p.memory_gb:
            return int(p.memory_gb * 1024)
        return self.gpu.memory_mib * p.memory_slices // m.memory_slices


@dataclass(eq=False)
class _Gpu:
    index: int
    uuid: str
    model: GpuModel
    name: str
    memory_mib: int
    mig_current: int
    mig_pending: int
    load: LoadPattern
    instance_loads: dict[int, LoadPattern]
    gis: dict[int, _GpuInstance] = field(default_factory=dict)
    processes: list[_Process] = field(default_factory=list)
    lost: bool = False
    ecc_uncorrected: int = 0


class _MigDevice:
    """A MIG device handle: one compute instance of one GPU instance."""

    __slots__ = ("ci",)

    def __init__(self, ci: _ComputeInstance) -> None:
        self.ci = ci

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _MigDevice) and other.ci is self.ci

    def __hash__(self) -> int:
        return id(self.ci)

    def __repr__(self) -> str:
        return f"<sim MIG device {self.ci.uuid}>"


_TDP_W = {"T4": 70, "L4": 72, "A10": 150, "A30-24GB": 165, "H100-80GB": 700, "A100-80GB": 400}


def _product_name(model: GpuModel) -> str:
    return model.product_names[0] if model.product_names else "NVIDIA " + model.name


def _fitting_starts(model: GpuModel, taken: list[tuple[str, int]], p: MigProfile) -> list[int]:
    return list(mig_new_starts(model, taken, p.name))


def _read_yaml(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    text = source
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        if path.exists():
            text = path.read_text()
    try:
        raw = yaml.safe_load(str(text))
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML ({e})", field="pool config") from None
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a mapping", field="pool config")
    return raw
