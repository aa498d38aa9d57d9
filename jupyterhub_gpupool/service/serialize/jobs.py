"""A job's JSON (``GET jobs/{id}``, the job commands' answers, the runner's list) and its
output's (``GET|POST jobs/{id}/logs``)."""

from __future__ import annotations

from typing import Any

from ...store.read.jobs import JobDevice, JobLogAppended, JobLogView, JobView
from ...timeparse import format_time

__all__ = ["device_json", "job_json", "job_log_appended_json", "job_log_json"]


def device_json(device: JobDevice) -> dict[str, Any]:
    """One device: ``gpu`` uuid, ``index`` on its node, ``mig`` (profile, start, uuid) or
    null."""
    mig = device.mig
    return {
        "gpu": device.gpu,
        "index": device.index,
        "mig": None
        if mig is None
        else {"profile": mig.profile, "start": mig.start, "uuid": mig.uuid},
    }


def job_json(job: JobView) -> dict[str, Any]:
    """The job as the API writes it; ``env`` only when the view carries it (the runner's)."""
    out: dict[str, Any] = {
        "id": job.id,
        "user": job.user,
        "group": job.group,
        "name": job.name,
        "offer": job.offer,
        "class": job.workload,
        "replicas": job.replicas,
        "command": list(job.command),
        "cwd": job.cwd,
        "state": job.state,
        "position": job.position,
        "lease_id": job.lease_id,
        "node": job.node,
        "devices": [device_json(d) for d in job.devices],
        "created": format_time(job.created),
        "started": format_time(job.started),
        "ended": format_time(job.ended),
        "exit_code": job.exit_code,
        "notice_deadline": format_time(job.notice_deadline),
        "reason": job.reason,
        "runner": job.runner,
        "runner_ref": dict(job.runner_ref) if job.runner_ref is not None else None,
    }
    if job.env is not None:
        out["env"] = dict(job.env)
    return out


def job_log_json(log: JobLogView) -> dict[str, Any]:
    """A part of the output: ``offset``, ``data``, ``next`` and ``complete``."""
    return {"offset": log.offset, "data": log.data, "next": log.next, "complete": log.complete}


def job_log_appended_json(answer: JobLogAppended) -> dict[str, Any]:
    """Where the runner's next part starts: ``next``."""
    return {"next": answer.next}
