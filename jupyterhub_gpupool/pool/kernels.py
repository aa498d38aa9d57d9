"""Kernel leases: a GPU held by one notebook kernel, not by a whole server (issue 36).

A kernel's lease is an ordinary lease row (``server`` = ``kernel:<kernel id>``, ``holder`` =
``kernel``, class ``interactive``), so quota, queue, usage and chargeback see it as they see a
server. Nothing on the hub runs it: the user's server (its ``gpupool`` kernel provisioner)
reports the kernel's execution state every few seconds, and these rules judge from those
reports alone whether the kernel is still alive and whether it is idle.

* **lost**: no report for ``report_timeout`` seconds (the server or its provisioner is gone);
  the lease is released (``orphaned``), no notice: nobody is there to read it;
* **idle**: no execution for ``idle_timeout`` seconds: a notice (the kernel will be shut down
  at the deadline, its variables lost); any execution before the deadline cancels it;
* **reclaim**: the notice's deadline passed without an execution: the lease is released
  (``idle``) and the provisioner shuts the kernel down at its next report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import PoolError

#: The lease holder of a kernel (``LeaseRow.holder``).
KERNEL_HOLDER = "kernel"
#: What a kernel's lease's ``server`` starts with.
KERNEL_PREFIX = "kernel:"
#: The execution states a provisioner reports (Jupyter's kernel status words).
KERNEL_STATES = ("busy", "idle", "starting")
_KERNEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True)
class KernelRules:
    """The kernel-level reclaim's timings (seconds; ``idle_timeout`` 0: never idle-reclaimed)."""

    idle_timeout: float = 3600.0
    notice: float = 300.0
    report_timeout: float = 120.0


def kernel_server(kernel_id: str) -> str:
    """The ``server`` of a kernel's lease."""
    return KERNEL_PREFIX + kernel_id


def check_kernel_id(kernel_id: object) -> str:
    """A kernel id as Jupyter makes them (a uuid), or ``invalid_field``."""
    if not isinstance(kernel_id, str) or not _KERNEL_ID.match(kernel_id):
        raise PoolError(
            "must be 1-200 letters, digits, '.', '_' or '-'",
            field="kernel_id",
            code="invalid_field",
        )
    return kernel_id


def check_kernel_state(state: object) -> str:
    """A reported execution state, or ``invalid_field``."""
    if state not in KERNEL_STATES:
        raise PoolError(
            f"must be one of {', '.join(KERNEL_STATES)}",
            field="state",
            allowed=KERNEL_STATES,
            code="invalid_field",
        )
    return str(state)


def kernel_verdict(
    now: float,
    last_report: float,
    last_busy: float,
    notice_deadline: float | None,
    rules: KernelRules,
) -> str:
    """What happens to a live kernel lease now: ``lost``, ``reclaim`` (the notice ran out),
    ``notice`` (idle too long, no notice yet) or ``keep``. Times are epoch seconds;
    ``last_busy`` is the last report of an execution (the grant, before any)."""
    if now - last_report > rules.report_timeout:
        return "lost"
    if notice_deadline is not None:
        return "reclaim" if now >= notice_deadline else "keep"
    if rules.idle_timeout > 0 and now - last_busy >= rules.idle_timeout:
        return "notice"
    return "keep"


def idle_notice(idle_for: float, notice: float) -> str:
    """The notice a user reads: why, when, and that the kernel's variables will be lost."""
    return (
        f"This GPU kernel has not run anything for {round(idle_for / 60)} min: it will be shut "
        f"down in {round(notice / 60)} min and its GPU released unless a cell runs before then. "
        "Its variables will be lost: save what you need (the notebook itself is kept)."
    )
