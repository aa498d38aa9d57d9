"""The effects on a job and a kernel (``pool.effects``): what their rows keep beside the
lease each holds (``pool.holders``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a job's end carries its lease's effects
    from .effects import Effect


@dataclass(frozen=True)
class NewJob:
    """A job asked now: what its new row keeps (``runner`` None: the local runner's)."""

    id: str
    user: str
    name: str
    offer: str
    workload: str
    command: tuple[str, ...]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    runner: str | None = None
    runner_ref: Mapping[str, str] | None = None


@dataclass(frozen=True)
class JobSubmitted:
    """A job's row is written, holding the lease ``lease_id`` asked with it (a
    ``LeaseGranted``, ``LeaseQueued`` or ``AwaitingApproval`` just before): the lease is the
    job's (``holder`` job, its class; no server binds it, so it never expires), the job is
    ``granted`` with it or ``queued``."""

    lease_id: str
    job: NewJob


@dataclass(frozen=True)
class JobSeen:
    """The job's runner reported (its heartbeat; ``pid`` when it said one)."""

    job_id: str
    pid: int | None = None


@dataclass(frozen=True)
class JobStarted:
    """The runner started a granted job (granted → running)."""

    job_id: str
    pid: int | None = None


@dataclass(frozen=True)
class JobCancelling:
    """A running job is to be stopped by its runner (→ ``cancelling``); it ends when the
    runner reports the exit."""

    job_id: str


@dataclass(frozen=True)
class JobPreempting:
    """A running job's preemption notice (→ ``preempting``): its runner stops it by
    ``deadline`` (epoch seconds). ``for_request``: the waiter it makes way for, with
    ``grace`` its class's seconds; ``notice``: else the kind of the enforced notice on its
    lease (an administrator's, a drain's, a spent budget's) that it follows."""

    job_id: str
    deadline: float
    reason: str
    for_request: str | None = None
    grace: int | None = None
    notice: str | None = None


@dataclass(frozen=True)
class JobEnded:
    """A job ends as ``state`` (``reason``, ``exit_code``: None leaves them as they are);
    ``lease``: the end of its lease that follows (``pool.ending.finishing``'s effects, the
    pool's own act: audited as the system's), then its audit event ``event`` with ``data``."""

    job_id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    lease: tuple[Effect, ...] = ()
    event: str = "job-ended"
    data: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class KernelRequested:
    """A kernel's lease ``lease_id`` was asked just before: it is the kernel's (``holder``
    kernel, class ``workload``, no expiry), reported alive and busy from now."""

    lease_id: str
    workload: str


@dataclass(frozen=True)
class KernelBusy:
    """The kernel's provisioner reported an execution (its last input is now)."""

    lease_id: str


@dataclass(frozen=True)
class KernelNoticed:
    """An idle kernel's notice: its lease is released at ``deadline`` (epoch seconds) unless
    a cell runs before; ``reason`` is what the user reads."""

    lease_id: str
    deadline: float
    reason: str


@dataclass(frozen=True)
class KernelNoticeCancelled:
    """A kernel under an idle notice ran a cell: the notice is called off."""

    lease_id: str
