"""Local NVML readings of the devices this server was given, where the server has NVML.

The pool's samples come from the node agent every few seconds; NVML on the server itself reads
the same device (a ``MIG-…`` UUID is opened as a MIG device handle) with no delay, and knows
the memory total. Without NVML (no ``pynvml``, no driver library, a CPU-only image) the panel
says so and shows the pool's readings only.
"""

from __future__ import annotations

import importlib
from typing import Any


class LocalGPU:
    """Reads devices by UUID through a module with pynvml's function names (``pynvml``, or a
    simulated NVML in tests and the demo)."""

    def __init__(self, module: str = "pynvml") -> None:
        self.module_name = module
        self.nvml: Any = None
        self.reason = ""
        try:
            self.nvml = importlib.import_module(module) if module else None
            if self.nvml is None:
                self.reason = "NVML is switched off on this server"
            else:
                self.nvml.nvmlInit()
        except ImportError:
            self.nvml = None
            self.reason = f"NVML is not installed on this server ({module} cannot be imported)"
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.nvml = None
            self.reason = f"NVML is not available on this server ({_nvml_text(e)})"

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def read(self, uuids: list[str]) -> dict[str, Any]:
        """``{"available", "reason", "devices": [{uuid, name, util, memory_used_mib,
        memory_total_mib, processes}]}``; a device NVML does not see is left out with why."""
        if self.nvml is None:
            return {"available": False, "reason": self.reason, "devices": []}
        devices, missing = [], []
        for uuid in uuids:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception as e:
                missing.append(f"{uuid}: {_nvml_text(e)}")
                continue
            devices.append(self._read_one(uuid, handle))
        reason = ""
        if missing:
            reason = "NVML does not see " + "; ".join(missing)
        return {"available": bool(devices), "reason": reason, "devices": devices}

    def _read_one(self, uuid: str, handle: Any) -> dict[str, Any]:
        nvml = self.nvml
        out: dict[str, Any] = {"uuid": uuid, "name": None, "util": None}
        try:
            name = nvml.nvmlDeviceGetName(handle)
            out["name"] = name.decode() if isinstance(name, bytes) else name
        except Exception:
            pass
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            out["memory_used_mib"] = int(mem.used // (1024 * 1024))
            out["memory_total_mib"] = int(mem.total // (1024 * 1024))
        except Exception:
            out["memory_used_mib"] = out["memory_total_mib"] = None
        try:  # NotSupported on MIG devices and MIG-mode GPUs: the pool's GPM figures stand
            out["util"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            out["util"] = None
        try:
            out["processes"] = len(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:
            out["processes"] = None
        return out


def _nvml_text(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.replace("\n", " ")[:200]
