"""A GPU kernel's lease as the pool shows it: ``KernelView``, the lease (``LeaseView``) with
what is the kernel's own (its id, the devices it runs on, the provisioner's last reports, the
kernel's idle notice), built by ``kernel_view`` from the row and the allocator held still."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ... import orm
from ...pool.allocator import Allocator
from ...pool.kernels import KERNEL_PREFIX
from .jobs import JobDevice, live_devices
from .leases import LeaseView


@dataclass(frozen=True)
class KernelNotice:
    """The kernel's own idle notice: the kernel is shut down at ``deadline`` unless it runs
    something (not the reclaimer's notice, which never covers kernels)."""

    deadline: datetime
    message: str | None


@dataclass(frozen=True)
class KernelView:
    """A kernel's lease: ``lease``, the kernel's id, its ``devices`` (none unless live), the
    provisioner's ``last_report`` and ``last_busy`` (its last report of an execution), and
    its ``notice``."""

    lease: LeaseView
    kernel_id: str
    devices: tuple[JobDevice, ...]
    last_report: datetime | None
    last_busy: datetime | None
    notice: KernelNotice | None


def kernel_view(lease: LeaseView, alloc: Allocator | None, row: orm.LeaseRow) -> KernelView:
    """``row`` (a kernel's lease, ``lease`` its view) as a ``KernelView``. The kernel's notice
    is a deadline with no reclaim kind (``store/kernels.py`` says why)."""
    notice = None
    if row.reclaim_deadline is not None and row.reclaim_kind is None:
        notice = KernelNotice(row.reclaim_deadline, row.reclaim_reason)
    return KernelView(
        lease=lease,
        kernel_id=row.server[len(KERNEL_PREFIX) :],
        devices=live_devices(alloc, row),
        last_report=row.keepalive,
        last_busy=row.last_input,
        notice=notice,
    )
