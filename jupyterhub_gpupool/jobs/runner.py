"""The local job runner: granted job leases become processes pinned to their devices.

On one machine (the embedded default, the demo) nothing else runs a job, so a runner beside the
node agent does: every round it asks the pool for its node's jobs (``GET nodes/{node}/jobs``:
those granted and not yet started, and those the pool wants stopped), then

* starts each granted job as a process in a session of its own, with ``CUDA_VISIBLE_DEVICES``
  (and ``NVIDIA_VISIBLE_DEVICES``) naming exactly the granted GPU UUIDs or ``MIG-<uuid>``
  slices, ``GPUPOOL_JOB_ID`` and ``GPUPOOL_PREEMPT_NOTICE`` (where a preemption notice will be
  written), its output kept in a log file;
* tells the pool each live job is running (the heartbeat that keeps the reconcile from
  treating its lease as an orphan) and uploads the log's new bytes;
* on a preemption (``preempting``, with the pool's ``notice_deadline``) writes the notice file
  (JSON: ``deadline``, ``reason``), sends SIGTERM to the job's process group at once, so a
  training script can checkpoint, and SIGKILL at the deadline; on a cancel (``cancelling``)
  SIGTERM, then SIGKILL after ``cancel_grace`` seconds;
* reports the exit status as soon as a process ends, so the pool releases the lease at once.

Jobs run as the runner's own system user (as ``SimpleLocalProcessSpawner`` runs servers): the
runner is for one-machine pools whose users share a trust domain; on Kubernetes the cluster runs
jobs (Kueue). Time comes from an injectable clock, so the tests drive deadlines, not sleeps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..poolclient import PoolClient, PoolClientError
from ..timeparse import parse_time

log = logging.getLogger("jupyterhub_gpupool.jobs")

#: The most log bytes sent in one upload (a chatty job catches up over a few rounds).
LOG_CHUNK = 64 * 1024


class NotReady(Exception):
    """The job's devices are not made yet (a MIG instance the agent is still creating)."""


def device_env(job: Mapping[str, Any]) -> dict[str, str]:
    """The CUDA pinning of a job: its devices (a MIG slice by its ``MIG-`` uuid, a whole or
    shared GPU by its uuid), in grant order, each GPU once. No devices: no GPU at all."""
    devices: list[str] = []
    for d in job.get("devices") or ():
        if d.get("mig") is not None:
            if not d["mig"].get("uuid"):
                raise NotReady(f"job {job.get('id')}: its MIG slice has no instance yet")
            devices.append(str(d["mig"]["uuid"]))
        else:
            devices.append(str(d["gpu"]))
    if not devices:
        return {"CUDA_VISIBLE_DEVICES": "-1", "NVIDIA_VISIBLE_DEVICES": "void"}
    visible = ",".join(dict.fromkeys(devices))
    return {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}


@dataclass
class Running:
    """A process this runner started for a job, and how far its stopping has gone."""

    job_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    notice_path: Path
    sent: int = 0  # log bytes the pool has
    stopping: str = ""  # "", "preempting" or "cancelling"
    kill_at: float | None = None
    killed: bool = False
    events: list[str] = field(default_factory=list)


class RunnerLoop:
    """One node's runner: ``step()`` is one round (the app calls it every ``interval``)."""

    def __init__(
        self,
        client: PoolClient,
        node: str,
        workdir: Path,
        *,
        clock: Callable[[], float],
        cancel_grace: float = 10.0,
        base_env: Mapping[str, str] | None = None,
        home_template: str = "",
    ) -> None:
        self.client = client
        self.node = node
        self.workdir = Path(workdir)
        self.clock = clock
        self.cancel_grace = cancel_grace
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.home_template = home_template
        self.running: dict[str, Running] = {}
        #: jobs this runner has finished (reported or not): never started twice
        self.done: set[str] = set()

    # -- one round ------------------------------------------------------------------------

    async def step(self) -> None:
        """Start what was granted, stop what the pool wants stopped, report what ended."""
        try:
            jobs = await self.client.node_jobs(self.node)
        except PoolClientError as e:
            log.warning("Job runner for %s: the pool's job list: %s", self.node, e)
            jobs = []
        for job in jobs:
            jid = str(job["id"])
            state = job.get("state")
            if state == "granted" and jid not in self.running and jid not in self.done:
                await self._start(job)
            elif state in ("preempting", "cancelling") and jid in self.running:
                self._stop(self.running[jid], str(state), job)
            elif state in ("preempting", "cancelling") and jid not in self.running:
                # granted and stopped before this runner started it (or after it restarted)
                await self._report(jid, "exited", None)
        for run in list(self.running.values()):
            await self._tend(run)

    async def close(self) -> None:
        """Stop every job this runner holds (the runner is stopping) and report them."""
        for run in list(self.running.values()):
            self._signal(run, signal.SIGTERM)
        for run in list(self.running.values()):
            try:
                run.proc.wait(timeout=self.cancel_grace)
            except subprocess.TimeoutExpired:
                self._signal(run, signal.SIGKILL)
                run.proc.wait()
            await self._tend(run)

    # -- the steps ------------------------------------------------------------------------

    def _cwd(self, job: Mapping[str, Any], own: Path) -> Path:
        """Where the job runs: the directory it was submitted from, when it is on this
        machine; else the user's home (``home_template``); else the job's own directory."""
        for candidate in (job.get("cwd"), self._home(job)):
            if candidate and Path(str(candidate)).is_dir():
                return Path(str(candidate))
        return own

    def _home(self, job: Mapping[str, Any]) -> str:
        if not self.home_template:
            return ""
        return self.home_template.format(username=job.get("user", ""))

    async def _start(self, job: Mapping[str, Any]) -> None:
        jid = str(job["id"])
        try:
            devices = device_env(job)
        except NotReady:
            return  # the next round, once the pool says the instance exists
        own = self.workdir / jid
        own.mkdir(parents=True, exist_ok=True)
        log_path, notice = own / "output.log", own / "preempt-notice.json"
        try:
            env = {
                **self.base_env,
                **{str(k): str(v) for k, v in (job.get("env") or {}).items()},
                **devices,
                "GPUPOOL_JOB_ID": jid,
                "GPUPOOL_PREEMPT_NOTICE": str(notice),
            }
            command = [str(a) for a in job.get("command") or ()]
            if not command:
                raise ValueError("the job has no command")
            with log_path.open("ab") as out:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self._cwd(job, own),
                    env=env,
                    start_new_session=True,  # its own process group: signals reach its children
                )
        except (OSError, ValueError) as e:
            # a command that cannot start is a failed job, with the reason in its log
            line = f"jupyterhub-gpupool: the job could not start: {e}\n"
            with log_path.open("a") as out:
                out.write(line)
            self.done.add(jid)
            try:
                await self.client.job_log_append(jid, 0, line)
            except PoolClientError as err:
                log.warning("Job %s: log upload: %s", jid, err)
            await self._report(jid, "exited", 127)  # the shell's "command not found"
            return
        log.info("Job %s started (pid %d) on %s", jid, proc.pid, env["CUDA_VISIBLE_DEVICES"])
        self.running[jid] = Running(jid, proc, log_path, notice)
        await self._report(jid, "running", None, pid=proc.pid)

    def _stop(self, run: Running, why: str, job: Mapping[str, Any]) -> None:
        now = self.clock()
        if run.stopping == why:
            return
        run.stopping = why
        if why == "preempting":
            deadline = parse_time(job.get("notice_deadline"))
            kill_at = deadline.timestamp() if deadline is not None else now + self.cancel_grace
            run.notice_path.write_text(
                json.dumps(
                    {
                        "deadline": job.get("notice_deadline"),
                        "reason": job.get("reason") or "preempted",
                    }
                )
            )
        else:
            kill_at = now + self.cancel_grace
        run.kill_at = kill_at if run.kill_at is None else min(run.kill_at, kill_at)
        self._signal(run, signal.SIGTERM)
        log.info("Job %s %s: SIGTERM sent, SIGKILL at %.0f", run.job_id, why, run.kill_at)

    async def _tend(self, run: Running) -> None:
        code = run.proc.poll()
        if code is None and run.kill_at is not None and self.clock() >= run.kill_at:
            if not run.killed:
                self._signal(run, signal.SIGKILL)
                run.killed = True
            code = run.proc.wait()
        await self._upload(run)
        if code is None:
            await self._report(run.job_id, "running", None, pid=run.proc.pid)
            return
        self.running.pop(run.job_id, None)
        self.done.add(run.job_id)
        log.info("Job %s exited with status %s", run.job_id, code)
        await self._report(run.job_id, "exited", code)

    @staticmethod
    def _signal(run: Running, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(run.proc.pid, sig)

    async def _upload(self, run: Running) -> None:
        """Send the log's bytes the pool does not have yet (one chunk a round)."""
        try:
            with run.log_path.open("rb") as f:
                f.seek(run.sent)
                data = f.read(LOG_CHUNK)
        except OSError:
            return
        if not data:
            return
        # never split a UTF-8 character between two uploads
        cut = len(data)
        if len(data) == LOG_CHUNK:
            while cut > 0 and (data[cut - 1] & 0xC0) == 0x80:
                cut -= 1
            if cut > 0 and data[cut - 1] >= 0xC0:
                cut -= 1
            cut = cut or len(data)
        try:
            await self.client.job_log_append(
                run.job_id, run.sent, data[:cut].decode("utf-8", "replace")
            )
        except PoolClientError as e:
            log.warning("Job %s: log upload: %s", run.job_id, e)
            return  # the same bytes again next round
        run.sent += cut

    async def _report(
        self, job_id: str, state: str, exit_code: int | None, pid: int | None = None
    ) -> None:
        try:
            await self.client.job_status(job_id, state, exit_code=exit_code, pid=pid)
        except PoolClientError as e:
            log.warning("Job %s: status %s: %s", job_id, state, e)
