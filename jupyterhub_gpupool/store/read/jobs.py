"""A job as the pool answers it: its row, its lease's queue position, replicas and devices.

``job_view`` is a plain function of the rows and the allocator (held still by the caller), so
the store's reads and its job commands answer the same value; ``live_devices`` is also what
the applier records on a granted job's row (``JobRow.devices``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ... import orm
from ...pool.allocator import Allocator
from ..rows import mig_devices

__all__ = [
    "JobDevice",
    "JobLogAppended",
    "JobLogView",
    "JobMig",
    "JobView",
    "job_log_view",
    "job_view",
    "live_devices",
    "stored_devices",
]


@dataclass(frozen=True)
class JobMig:
    """The MIG instance a device is: its profile, its start slice, its ``MIG-…`` uuid once
    made (None before)."""

    profile: str | None
    start: int | None
    uuid: str | None


@dataclass(frozen=True)
class JobDevice:
    """One device a job runs on: the GPU's uuid, its index on the node (None when the
    allocator does not know the GPU), and the MIG instance or None for a whole/shared GPU."""

    gpu: str
    index: int | None
    mig: JobMig | None


@dataclass(frozen=True)
class JobView:
    """A job: what it runs (``command``, ``cwd``; ``env`` only for its runner, else None), for
    whom and on which lease, where it is (``state``; ``position`` in the queue while queued),
    where it runs (``node``, ``devices``) and how it went. ``runner`` is ``local`` for the
    pool's job runner; ``workload`` is the wire's ``class``."""

    id: str
    user: str
    group: str | None
    name: str
    offer: str
    workload: str
    replicas: int
    command: tuple[str, ...]
    cwd: str | None
    state: str
    position: int | None
    lease_id: str | None
    node: str | None
    devices: tuple[JobDevice, ...]
    created: datetime | None
    started: datetime | None
    ended: datetime | None
    exit_code: int | None
    notice_deadline: datetime | None
    reason: str | None
    runner: str
    runner_ref: Mapping[str, str] | None
    env: Mapping[str, str] | None = None


def live_devices(alloc: Allocator | None, row: orm.LeaseRow) -> tuple[JobDevice, ...]:
    """What a live lease's holder runs on, one device per slot (none for a lease not live)."""
    if row.state not in orm.LIVE_STATES:
        return ()
    mig = mig_devices(alloc, row)
    out = []
    for s in row.slots:
        gpu = alloc.gpus.get(s.gpu_uuid) if alloc is not None else None
        instance = None
        if s.kind == "mig":
            made = mig.get((s.gpu_uuid, s.start), (None, False))[0]
            instance = JobMig(s.profile, s.start, made)
        out.append(JobDevice(s.gpu_uuid, gpu.index if gpu is not None else None, instance))
    return tuple(out)


def stored_devices(devices: Iterable[Mapping[str, Any]]) -> tuple[JobDevice, ...]:
    """The devices a job's row recorded (``JobRow.devices``: what it ran on, kept after its
    lease ended)."""
    out = []
    for d in devices:
        m = d.get("mig")
        mig = JobMig(m.get("profile"), m.get("start"), m.get("uuid")) if m else None
        out.append(JobDevice(d["gpu"], d.get("index"), mig))
    return tuple(out)


def job_view(
    job: orm.JobRow,
    lease: orm.LeaseRow | None,
    alloc: Allocator | None,
    now: float,
    *,
    with_env: bool = False,
) -> JobView:
    """``job`` with its ``lease`` (None: it has none); ``now`` (epoch seconds) orders the
    queue for a queued one's position; ``with_env`` carries the environment (its runner's
    reads only)."""
    position = None
    if lease is not None and lease.state == "queued" and alloc is not None:
        position = alloc.position(lease.id, now)
    if lease is not None and lease.state in orm.LIVE_STATES:
        devices = live_devices(alloc, lease)
    else:
        devices = stored_devices(job.devices or ())
    return JobView(
        id=job.id,
        user=job.user,
        group=job.group,
        name=job.name,
        offer=job.offer,
        workload=job.workload,
        replicas=lease.replicas if lease is not None else 1,
        command=tuple(job.command),
        cwd=job.cwd,
        state=job.state,
        position=position,
        lease_id=job.lease_id,
        node=job.node,
        devices=devices,
        created=job.created,
        started=job.started,
        ended=job.ended,
        exit_code=job.exit_code,
        notice_deadline=job.notice_deadline,
        reason=job.reason,
        runner=job.runner or "local",
        runner_ref=dict(job.runner_ref) if job.runner_ref else None,
        env=dict(job.env or {}) if with_env else None,
    )


@dataclass(frozen=True)
class JobLogView:
    """A part of a job's output (``GET jobs/{id}/logs``): ``data`` from ``offset``, where the
    next part starts (``next``), and whether the job ended (``complete``: no more will come)."""

    offset: int
    data: str
    next: int
    complete: bool


@dataclass(frozen=True)
class JobLogAppended:
    """The answer of the runner's upload (``POST jobs/{id}/logs``): where its next part
    starts."""

    next: int


def job_log_view(job: orm.JobRow, offset: int) -> JobLogView:
    """``job``'s output from ``offset`` (an offset before what is kept starts at the oldest
    kept character, one past the end at the end)."""
    end = job.log_start + len(job.log)
    start = min(max(offset, job.log_start), end)
    return JobLogView(
        offset=start,
        data=job.log[start - job.log_start :],
        next=end,
        complete=job.state in orm.JOB_FINAL,
    )
