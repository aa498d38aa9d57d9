"""Who holds a lease, and the rules that differ by holder.

A lease is held by a hub server (``holder`` None), a job (``job``: ``server`` = ``job:<id>``,
its runner's reports keep it) or a notebook kernel (``kernel``: ``server`` =
``kernel:<id>``, its provisioner's reports keep it). The store reads each holder's facts
(its rows) and asks these rules; there is one store method per command, not one per holder,
so no behaviour depends on the order its parts are put together in.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

from .kernels import KERNEL_HOLDER
from .workloads import JOB_HOLDER

#: What a job's lease's ``server`` starts with.
JOB_PREFIX = "job:"
#: Job states (``JobRow.state``) that are final.
JOB_FINAL = ("succeeded", "failed", "cancelled", "preempted")
#: Lease release reasons that mean someone called the job off (not that it failed).
CALLED_OFF = ("cancelled", "withdrawn", "denied", "stopped", "admin")


def job_server(job_id: str) -> str:
    """The ``server`` of a job's lease."""
    return JOB_PREFIX + job_id


def job_of(holder: str | None, server: str) -> str | None:
    """The id of the job holding a lease (None: no job holds it)."""
    return server[len(JOB_PREFIX) :] if holder == JOB_HOLDER else None


def refuse_for_job(holder: str | None) -> bool:
    """Whether a lease refuses a server's keepalive or resize: a job's does (its runner's
    reports bind it, and a target would be a lease of no server and no job)."""
    return holder == JOB_HOLDER


def job_granted(job_state: str) -> bool:
    """Whether a job follows its lease's grant (``queued`` → ``granted``)."""
    return job_state == "queued"


def job_after_lease(job_state: str, reason: str) -> tuple[str, str] | None:
    """A job whose lease ended another way than its runner's report (an admin, a lost node):
    its state and reason (``cancelled`` when someone called it off, else ``failed``); None
    when the job has ended already."""
    if job_state in JOB_FINAL:
        return None
    return ("cancelled" if reason in CALLED_OFF else "failed"), f"lease ended: {reason}"


def runner_silent(
    last_heard: float, notice_deadline: float | None, now: float, timeout: float
) -> bool:
    """Whether a job's runner fell silent: no report for ``timeout`` seconds since
    ``last_heard`` (its last report, else its grant, else its submission; never before the
    pool started watching), nor since its preemption notice's deadline passed."""
    last = last_heard if notice_deadline is None else max(last_heard, notice_deadline)
    return last < now - timeout


@dataclass(frozen=True)
class Held:
    """A lease the hub's reconcile looks at: whose server it is, who holds it, its state."""

    id: str
    user: str
    server: str
    state: str
    holder: str | None = None


def orphans(
    leases: Iterable[Held],
    running: Set[tuple[str, str]],
    deleted: Set[tuple[str, str]],
    jobs_alive: Set[tuple[str, str]],
    reason: str,
) -> list[tuple[str, str]]:
    """(lease id, the reason it ends for) of each of ``leases`` nothing holds any more: a
    server's the hub neither runs nor spawns (``running``), a job's whose job has ended
    (``jobs_alive``: (user, ``job:<id>``) of the live ones), a request awaiting approval for
    a server the hub deleted (``deleted``: a stopped one keeps its request). A kernel's lease
    is never one: no hub server is its, its provisioner's reports keep it."""
    out = []
    for lease in leases:
        key = (lease.user, lease.server)
        if lease.state == "awaiting_approval":
            if key in deleted:
                out.append((lease.id, "withdrawn"))
        elif lease.holder == KERNEL_HOLDER or key in running or key in jobs_alive:
            continue
        else:
            out.append((lease.id, "cancelled" if lease.state == "queued" else reason))
    return out


__all__ = [
    "CALLED_OFF",
    "JOB_FINAL",
    "JOB_PREFIX",
    "Held",
    "job_after_lease",
    "job_granted",
    "job_of",
    "job_server",
    "orphans",
    "refuse_for_job",
    "runner_silent",
]
