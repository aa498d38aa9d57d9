# ruff: noqa: F405  (pynvml's constants, errors and structures come from simnvml_api)
"""The MIG half of the simulated NVML: GPU and compute instances, their profiles and placements.

Split from ``simnvml`` (a mixin of ``SimNvml``, which keeps the devices, GPM and the module
interface). The rules are NVIDIA's: profiles, IDs and placements come from the pool catalog,
an illegal or overlapping placement raises ``NVMLError_InsufficientResources``, a GPU instance
with compute instances (or a compute instance with processes) cannot be destroyed (``InUse``),
and MIG calls on a GPU not in MIG mode are ``NotSupported``.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from typing import TYPE_CHECKING, Any

from ..pool.catalog import MigProfile
from ..pool.errors import PoolError
from ..pool.miglayout import validate_mig_layout
from .simload import LoadPattern
from .simnvml_api import *  # noqa: F403  (pynvml's names: this module stands in for pynvml)
from .simnvml_api import _CI_SLICES, NVMLError, _api, _deref
from .simstate import _ComputeInstance, _fitting_starts, _Gpu, _GpuInstance, _MigDevice


class SimMigMixin:
    """MIG calls of a simulated machine (``SimNvml`` provides ``_gpu`` and ``_parent``)."""

    if TYPE_CHECKING:

        def _gpu(self, handle: Any) -> _Gpu: ...

        def _parent(self, handle: Any) -> _Gpu: ...

    # -- internals ----------------------------------------------------------------------------

    def _live_gi(self, gi: Any) -> _GpuInstance:
        if not isinstance(gi, _GpuInstance) or gi.destroyed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if gi.gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gi

    def _profile_for_enum(self, gpu: _Gpu, profile: int) -> MigProfile:
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.model.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        pid = ENUM_TO_ID.get(gpu.model.memory_slices, {}).get(profile)
        for p in gpu.model.profiles.values():
            if pid is not None and p.id == pid:
                return p
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, gpu: _Gpu, profile_id: int) -> MigProfile:
        if not gpu.model.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        for p in gpu.model.profiles.values():
            if p.id == profile_id:
                return p
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def _create_gi(self, gpu: _Gpu, profile: MigProfile, start: int) -> _GpuInstance:
        gi_id = min(set(range(1, 64)) - set(gpu.gis))
        load = gpu.instance_loads.get(start, LoadPattern())
        gi = _GpuInstance(gpu, gi_id, profile, start, load)
        gpu.gis[gi_id] = gi
        return gi

    def _create_ci(self, gi: _GpuInstance, slices: int, mig_uuid: str | None) -> _ComputeInstance:
        gpu = gi.gpu
        used_slots = {ci.slot for g in gpu.gis.values() for ci in g.cis.values()}
        slot = min(set(range(gpu.model.compute_slices)) - used_slots)
        ci_id = min(set(range(0, 8)) - set(gi.cis))
        if mig_uuid is None:
            key = f"{gpu.uuid}:{gi.start}:{gi.profile.name}:{ci_id}"
            mig_uuid = "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, key))
        ci_profile = {v: k for k, v in _CI_SLICES.items()}[slices]
        ci = _ComputeInstance(gi, ci_id, ci_profile, slices, slot, mig_uuid)
        gi.cis[ci_id] = ci
        return ci

    # -- NVML: MIG ----------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._parent(device)
        if not gpu.model.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_current, gpu.mig_pending]

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._parent(device)
        return gpu.model.compute_slices if gpu.mig_current else 0

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> _MigDevice:
        gpu = self._parent(device)
        if not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < gpu.model.compute_slices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for gi in gpu.gis.values():
            for ci in gi.cis.values():
                if ci.slot == index:
                    return _MigDevice(ci)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    @_api
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        self._gpu(device)
        return ctypes.c_uint(int(isinstance(device, _MigDevice)))

    @_api
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, _MigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return device.ci.gi.id

    @_api
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._gpu(device)
        if not isinstance(device, _MigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return device.ci.id

    @_api
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> _Gpu:
        gpu = self._gpu(migDevice)
        if not isinstance(migDevice, _MigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    @_api
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> c_nvmlGpuInstanceProfileInfo_v2_t:
        gpu = self._parent(device)
        if version not in (1, 2):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        p = self._profile_for_enum(gpu, profile)
        sms = {"hopper": 132, "blackwell": 148}.get(gpu.model.architecture, 98)
        return c_nvmlGpuInstanceProfileInfo_v2_t(
            version=version,
            id=p.id,
            isP2pSupported=0,
            sliceCount=p.compute_slices,
            instanceCount=p.max_count,
            multiprocessorCount=sms * p.compute_slices // gpu.model.compute_slices,
            copyEngineCount=p.compute_slices,
            decoderCount=p.compute_slices // 2,
            encoderCount=0,
            jpegCount=int(p.media_extensions or p.compute_slices == gpu.model.compute_slices),
            ofaCount=int(p.media_extensions or p.compute_slices == gpu.model.compute_slices),
            memorySizeMB=int((p.memory_gb or 0) * 1024),
            name=f"MIG {p.name}".encode(),
        )

    @_api
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self,
        device: Any,
        profileId: int,
        placementsRef: Any,
        countRef: Any,
    ) -> int:
        gpu = self._parent(device)
        p = self._profile_by_id(gpu, profileId)
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(p.starts)
            return NVML_SUCCESS
        array = _deref(placementsRef)
        if count.value < len(p.starts):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(p.starts):
            array[i].start, array[i].size = start, p.memory_slices
        count.value = len(p.starts)
        return NVML_SUCCESS

    @_api
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        gpu = self._parent(device)
        if not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        p = self._profile_by_id(gpu, profileId)
        taken = [(g.profile.name, g.start) for g in gpu.gis.values()]
        return len(_fitting_starts(gpu.model, taken, p))

    @_api
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self,
        device: Any,
        profileId: int,
        placement: Any,
    ) -> _GpuInstance:
        gpu = self._parent(device)
        if not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        p = self._profile_by_id(gpu, profileId)
        pl = _deref(placement)
        start, size = int(pl.start), int(pl.size)
        if size != p.memory_slices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        taken = [(g.profile.name, g.start) for g in gpu.gis.values()]
        try:
            validate_mig_layout(gpu.model, [*taken, (p.name, start)])
        except PoolError:  # illegal start, overlap, too many, out of compute slices
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES) from None
        return self._create_gi(gpu, p, start)

    @_api
    def nvmlDeviceGetGpuInstances(
        self,
        device: Any,
        profileId: int,
        gpuInstancesRef: Any,
        countRef: Any,
    ) -> int:
        gpu = self._parent(device)
        if not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        p = self._profile_by_id(gpu, profileId)
        found = sorted((g for g in gpu.gis.values() if g.profile is p), key=lambda g: g.start)
        array = _deref(gpuInstancesRef)
        if len(array) < len(found):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            array[i] = gi
        _deref(countRef).value = len(found)
        return NVML_SUCCESS

    @_api
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> _GpuInstance:
        gpu = self._parent(device)
        if not gpu.mig_current:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        try:
            return gpu.gis[gpuInstanceId]
        except KeyError:
            raise NVMLError(NVML_ERROR_NOT_FOUND) from None

    @_api
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        gi = self._live_gi(gpuInstance)
        return c_nvmlGpuInstanceInfo_t(
            gi.gpu,
            gi.id,
            gi.profile.id or 0,
            c_nvmlGpuInstancePlacement_t(gi.start, gi.profile.memory_slices),
        )

    @_api
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self,
        device: Any,
        profile: int,
        engProfile: int,
        version: int = 2,
    ) -> c_nvmlComputeInstanceProfileInfo_v2_t:
        gi = self._live_gi(device)
        if engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_SLICES.get(profile)
        total = gi.profile.compute_slices
        if slices is None or slices > total:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlComputeInstanceProfileInfo_v2_t(
            version=version,
            id=profile,
            sliceCount=slices,
            instanceCount=total // slices,
            multiprocessorCount=14 * slices,
            name=f"MIG {slices}c.{gi.profile.name}".encode(),
        )

    @_api
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpuInstance: Any, profileId: int
    ) -> _ComputeInstance:
        gi = self._live_gi(gpuInstance)
        slices = _CI_SLICES.get(profileId)
        if slices is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        used = sum(ci.slices for ci in gi.cis.values())
        if used + slices > gi.profile.compute_slices:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_ci(gi, slices, None)

    @_api
    def nvmlGpuInstanceGetComputeInstances(
        self,
        gpuInstance: Any,
        profileId: int,
        computeInstancesRef: Any,
        countRef: Any,
    ) -> int:
        gi = self._live_gi(gpuInstance)
        found = [ci for ci in gi.cis.values() if ci.profile_id == profileId]
        array = _deref(computeInstancesRef)
        if len(array) < len(found):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, ci in enumerate(found):
            array[i] = ci
        _deref(countRef).value = len(found)
        return NVML_SUCCESS

    @_api
    def nvmlGpuInstanceGetComputeInstanceById(
        self,
        gpuInstance: Any,
        computeInstanceId: int,
    ) -> _ComputeInstance:
        gi = self._live_gi(gpuInstance)
        try:
            return gi.cis[computeInstanceId]
        except KeyError:
            raise NVMLError(NVML_ERROR_NOT_FOUND) from None

    @_api
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> c_nvmlComputeInstanceInfo_t:
        ci = computeInstance
        if not isinstance(ci, _ComputeInstance) or ci.destroyed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._live_gi(ci.gi)
        return c_nvmlComputeInstanceInfo_t(ci.gi.gpu, ci.gi, ci.id, ci.profile_id)

    @_api
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> None:
        ci = computeInstance
        if not isinstance(ci, _ComputeInstance) or ci.destroyed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._live_gi(ci.gi)
        if ci.processes:
            raise NVMLError(NVML_ERROR_IN_USE)
        ci.destroyed = True
        del ci.gi.cis[ci.id]

    @_api
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> None:
        gi = self._live_gi(gpuInstance)
        # nvml.h: IN_USE "if processes (e.g. CUDA application) or compute instances are active"
        if gi.cis:
            raise NVMLError(NVML_ERROR_IN_USE)
        gi.destroyed = True
        del gi.gpu.gis[gi.id]
