"""Training and inference jobs from a notebook: the Python API of the pool's job leases.

In a notebook on a pool-spawned server (which knows the pool's API from ``$GPUPOOL_API_URL``
and acts with the server's own token, ``$JUPYTERHUB_API_TOKEN``)::

    from jupyterhub_gpupool import jobs

    job = jobs.submit(["python", "train.py"], offer="a100-3g", workload="training")
    job.status()        # 'queued', 'granted', 'running', 'succeeded', ...
    print(job.logs())   # what it printed so far
    job.cancel()
    job.wait()          # blocks until it ends; returns its final state

A job holds a lease of its own, not the server's: the server may stop while the job runs. The
calls are synchronous (they run on a private event loop in a worker thread when the notebook's
kernel already runs one), and a refusal raises :class:`~jupyterhub_gpupool.poolclient.PoolRefused`
with the pool's message (unknown offer, class not allowed, quota...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..poolclient import PoolClient

__all__ = ["ENDED", "Job", "connect", "get", "list_jobs", "submit"]

#: States a job does not leave.
ENDED = frozenset({"succeeded", "failed", "cancelled", "preempted"})

T = TypeVar("T")


def connect(api_url: str | None = None, token: str | None = None) -> PoolClient:
    """The pool client: ``api_url`` else ``$GPUPOOL_API_URL``; ``token`` else
    ``$JUPYTERHUB_API_TOKEN`` (a pool-spawned server has both)."""
    url = api_url or os.environ.get("GPUPOOL_API_URL", "")
    key = token or os.environ.get("JUPYTERHUB_API_TOKEN", "") or os.environ.get("GPUPOOL_TOKEN", "")
    if not url:
        raise ValueError(
            "where is the GPU pool? Set $GPUPOOL_API_URL (a pool-spawned server has it) or "
            "pass its API URL (--pool-url, api_url=), e.g. http://hub:8000/services/gpupool/api/v1/"
        )
    if not key:
        raise ValueError("no token: pass token=, or set $JUPYTERHUB_API_TOKEN")
    return PoolClient(url, key)


def _run(call: Callable[[], Awaitable[T]]) -> T:
    """Run one client call to its end, from plain code or from inside a running event loop
    (a notebook's kernel), where it runs on its own loop in a worker thread."""

    async def go() -> T:
        return await call()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


class Job:
    """A handle on one job: its id and what the pool last said of it (``info``)."""

    def __init__(self, info: Mapping[str, Any], client: PoolClient) -> None:
        self.info = dict(info)
        self.client = client

    @property
    def id(self) -> str:
        """The job's id (``job logs ID`` on the command line)."""
        return str(self.info["id"])

    def refresh(self) -> dict[str, Any]:
        """Ask the pool again; returns the job's JSON."""
        self.info = _run(lambda: self.client.job(self.id))
        return self.info

    def status(self) -> str:
        """The job's state now (queued, granted, running, succeeded, failed, ...)."""
        return str(self.refresh()["state"])

    def logs(self, offset: int = 0) -> str:
        """Its output from ``offset`` on, as much as the runner has sent so far."""
        out, at = [], offset
        while True:
            part = _run(lambda at=at: self.client.job_logs(self.id, at))  # type: ignore[misc]  # a default binds this round's offset
            out.append(str(part.get("data") or ""))
            nxt = int(part.get("next", at))
            if nxt <= at:
                return "".join(out)
            at = nxt

    def cancel(self) -> str:
        """Cancel it (a queued job at once; a running one is stopped); returns its state."""
        self.info = _run(lambda: self.client.cancel_job(self.id))
        return str(self.info["state"])

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> str:
        """Block until the job ends (or ``timeout`` seconds pass); returns its state."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status()
            if state in ENDED or (end is not None and time.monotonic() >= end):
                return state
            time.sleep(poll)

    def __repr__(self) -> str:
        i = self.info
        where = f" on {i['node']}" if i.get("node") else ""
        return f"<Job {self.id} {i.get('name') or ''!s} {i.get('offer')} {i.get('state')}{where}>"


def submit(
    command: Sequence[str],
    *,
    offer: str,
    workload: str = "training",
    name: str | None = None,
    group: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    replicas: int = 1,
    client: PoolClient | None = None,
) -> Job:
    """Ask the pool to run ``command`` on ``offer`` as a ``workload``-class job.

    It runs where the pool grants the GPU (on one machine: started by the job runner in
    ``cwd``, by default this process's working directory), with ``CUDA_VISIBLE_DEVICES`` set
    to the granted device. A ``training`` job may be preempted: it gets SIGTERM and a notice
    file (``$GPUPOOL_PREEMPT_NOTICE``) first, with the class's grace to checkpoint. An
    ``inference`` job may ask for ``replicas`` copies of a whole-GPU offer, all counted in the
    quota.
    """
    if isinstance(command, str):
        raise TypeError("command is a list of arguments, e.g. ['python', 'train.py']")
    c = client or connect()
    info = _run(
        lambda: c.submit_job(
            offer,
            list(command),
            workload=workload,
            name=name,
            group=group,
            env=dict(env) if env else None,
            cwd=cwd or os.getcwd(),
            replicas=replicas,
        )
    )
    return Job(info, c)


def list_jobs(state: str | None = None, client: PoolClient | None = None) -> list[Job]:
    """Your jobs (an administrator's token: everyone's), newest first."""
    c = client or connect()
    return [Job(j, c) for j in _run(lambda: c.jobs(state=state))]


def get(job_id: str, client: PoolClient | None = None) -> Job:
    """The handle of a job by id."""
    c = client or connect()
    return Job(_run(lambda: c.job(job_id)), c)
