"""A GPU kernel's JSON (``GET kernels``, the kernel commands' answers): its lease's JSON with
the kernel's own fields beside it."""

from __future__ import annotations

from typing import Any

from ...store.read.kernels import KernelView
from ...timeparse import format_time
from .jobs import device_json
from .leases import lease_json

__all__ = ["kernel_json"]


def kernel_json(kernel: KernelView) -> dict[str, Any]:
    """The lease's fields, then ``kernel_id``, ``lease_id``, ``devices``, ``last_report``,
    ``last_busy`` and ``notice`` (``deadline``, ``message``; null when none)."""
    notice = kernel.notice
    return {
        **lease_json(kernel.lease),
        "kernel_id": kernel.kernel_id,
        "lease_id": kernel.lease.id,
        "devices": [device_json(d) for d in kernel.devices],
        "last_report": format_time(kernel.last_report),
        "last_busy": format_time(kernel.last_busy),
        "notice": None
        if notice is None
        else {"deadline": format_time(notice.deadline), "message": notice.message},
    }
