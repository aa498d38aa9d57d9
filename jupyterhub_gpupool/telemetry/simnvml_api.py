"""The names of the pynvml API the simulated NVML exposes: constants (values as in nvml.h), the
``NVMLError_*`` classes with their ``.value`` codes, and the ctypes structures, with pynvml's
names and attribute names (split from ``simnvml``, which implements the functions)."""

from __future__ import annotations

import ctypes
import functools
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..pool.idlesignal import PROCESS_UTIL_ARCHITECTURES

# ---------------------------------------------------------------------------------------------
# Constants (values as in pynvml / nvml.h)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1

NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_MAX = 477

#: Pairs NVML_GPU_INSTANCE_PROFILE_* enum values with the profile IDs of ``nvidia-smi mig
#: -lgip`` (``MigProfile.id``). Copied from ``enum_to_id_observed`` in
#: /work/shared/reference/mig_profiles.json (matched by the enum meanings in nvml.h), keyed by
#: the GPU's number of memory slices. Profiles whose ID is not here cannot be reached by enum.
ENUM_TO_ID: Mapping[int, Mapping[int, int]] = {
    8: {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0},  # 8-memory-slice GPUs (A100, H100, ...)
    4: {0: 14, 7: 21, 1: 5, 8: 6, 3: 0},  # A30 (and 4-slice GPUs with the same IDs)
}

#: Compute-instance profile enum → compute slices (nvml.h).
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}

#: GPM metrics the simulator produces, as a share of the activity (graphics) percentage.
_GPM_SCALE = {
    NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    NVML_GPM_METRIC_SM_UTIL: 0.85,
    NVML_GPM_METRIC_SM_OCCUPANCY: 0.5,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.3,
    NVML_GPM_METRIC_DRAM_BW_UTIL: 0.4,
}
_GPM_MIN_INTERVAL = 0.1
#: Seconds between the driver's per-process utilization samples (nvmlDeviceGetProcessUtilization)
_PROCESS_SAMPLE_PERIOD = 1.0
#: Architectures with per-process utilization (nvml.h: "For Maxwell or newer fully supported
#: devices"); others (and models of unknown architecture) answer NotSupported.
_PROCESS_UTIL_ARCHITECTURES = PROCESS_UTIL_ARCHITECTURES

# ---------------------------------------------------------------------------------------------
# Exceptions, made like pynvml's ``_extractNVMLErrorsAsClasses``


class NVMLError(Exception):
    """NVML failure; ``NVMLError(code)`` returns the matching ``NVMLError_*`` subclass."""

    _valClassMapping: dict[int, type] = {}
    value: int

    def __new__(typ, value: int) -> NVMLError:
        if typ is NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        name = _CODE_NAMES.get(self.value)
        return name.replace("_", " ").title() if name else f"NVML Error with code {self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


_CODE_NAMES = {
    v: k.removeprefix("NVML_ERROR_")
    for k, v in dict(globals()).items()
    if k.startswith("NVML_ERROR_")
}


def _make_error_classes() -> None:
    for code, raw in _CODE_NAMES.items():
        name = "NVMLError_" + string.capwords(raw, "_").replace("_", "")

        def new(typ: type, *args: object, _code: int = code) -> NVMLError:
            return NVMLError.__new__(typ, _code)

        cls = type(name, (NVMLError,), {"__new__": new, "__module__": __name__})
        globals()[name] = cls
        NVMLError._valClassMapping[code] = cls


_make_error_classes()
# explicit names for linters and readers (created above)
NVMLError_Uninitialized: type[NVMLError] = globals()["NVMLError_Uninitialized"]
NVMLError_InvalidArgument: type[NVMLError] = globals()["NVMLError_InvalidArgument"]
NVMLError_NotSupported: type[NVMLError] = globals()["NVMLError_NotSupported"]
NVMLError_NotFound: type[NVMLError] = globals()["NVMLError_NotFound"]
NVMLError_FunctionNotFound: type[NVMLError] = globals()["NVMLError_FunctionNotFound"]
NVMLError_GpuIsLost: type[NVMLError] = globals()["NVMLError_GpuIsLost"]
NVMLError_InUse: type[NVMLError] = globals()["NVMLError_InUse"]
NVMLError_InsufficientResources: type[NVMLError] = globals()["NVMLError_InsufficientResources"]
NVMLError_ArgumentVersionMismatch: type[NVMLError] = globals()["NVMLError_ArgumentVersionMismatch"]


def _fail(code: int) -> NVMLError:
    return NVMLError(code)


# ---------------------------------------------------------------------------------------------
# Structures (same names and attribute names as pynvml)


class _Printable(ctypes.Structure):
    def __repr__(self) -> str:
        body = ", ".join(f"{n}={getattr(self, n)!r}" for n, *_ in self._fields_)
        return f"{type(self).__name__}({body})"


class c_nvmlGpuInstancePlacement_t(_Printable):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlMemory_t(_Printable):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlUtilization_t(_Printable):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlGpmSupport_t(_Printable):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


class c_nvmlGpuInstanceProfileInfo_v2_t(_Printable):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("isP2pSupported", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * 96),
    ]


class c_nvmlComputeInstanceProfileInfo_v2_t(_Printable):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("name", ctypes.c_char * 96),
    ]


class _HandleArrayType(type):
    """``(c_nvmlGpuInstance_t * n)()`` makes an n-slot array, as with pynvml's pointer types."""

    def __mul__(cls, n: int) -> Callable[[], list[None]]:
        return lambda: [None] * n


class c_nvmlGpuInstance_t(metaclass=_HandleArrayType):
    """GPU-instance handle type (only its array form is used by callers)."""


class c_nvmlComputeInstance_t(metaclass=_HandleArrayType):
    """Compute-instance handle type (only its array form is used by callers)."""


@dataclass
class c_nvmlGpuInstanceInfo_t:
    device: Any
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


@dataclass
class c_nvmlComputeInstanceInfo_t:
    device: Any
    gpuInstance: Any
    id: int
    profileId: int


@dataclass
class c_nvmlProcessInfo_v3_t:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class c_nvmlProcessUtilizationSample_t(_Printable):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),  # CPU time of the sample, microseconds
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


@dataclass
class c_metricInfo_t:
    shortName: str = ""
    longName: str = ""
    unit: str = ""


@dataclass
class c_nvmlGpmMetric_t:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0
    metricInfo: c_metricInfo_t = field(default_factory=c_metricInfo_t)


class c_nvmlGpmMetricsGet_t:
    """What ``nvmlGpmMetricsGet`` fills: set version, numMetrics, samples and metric IDs."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)]


class c_nvmlGpmSample_t:
    """An opaque GPM sample buffer (``nvmlGpmSampleAlloc``)."""

    def __init__(self) -> None:
        self.freed = False
        self.filled = False
        self.ts = 0.0
        # (GPU, GPU instance or None): what the counters belong to
        self.source: tuple[Any, ...] = ()


def _deref(ref: Any) -> Any:
    """The object behind ``ctypes.byref(x)`` (or ``x`` itself)."""
    return getattr(ref, "_obj", ref)


def _api(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Check init and simulated missing symbols (old drivers) before an NVML call (wraps every
    ``nvml*`` method of the simulated machine)."""
    name = fn.__name__

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if name in self._missing:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._init_count <= 0 and name != "nvmlInit":
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return fn(self, *args, **kwargs)

    return call
