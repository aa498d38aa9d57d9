"""Jobs: a user submits a command for an offer and a workload class; the job runner beside the
node agent starts it on the granted device, reports it and uploads its output.

User side (``custom:gpupool:use``; their own jobs, admins any, a spawner for any user):
``POST jobs``, ``GET jobs``, ``GET|DELETE jobs/{id}``, ``GET jobs/{id}/logs``. Runner side
(``custom:gpupool:agent``): ``GET nodes/{name}/jobs``, ``POST jobs/{id}/status``,
``POST jobs/{id}/logs``. A job that is not the caller's is answered as a missing one.
"""

from __future__ import annotations

from ...orm import JOB_STATES
from ...pool import commands
from ...pool.errors import PoolError
from ...store.jobs import job_not_found
from ..serialize.jobs import job_json, job_log_appended_json, job_log_json
from .base import APIError, APIHandler, needs


class _JobHandler(APIHandler):
    """Base of the handlers addressing one job as its user."""

    def _check(self, job_id: str) -> None:
        self.require_owner(self.store.job_owner(job_id), job_not_found(job_id))


class JobsHandler(APIHandler):
    """``POST jobs`` (submit) and ``GET jobs`` (list)."""

    route_name = "jobs"

    @needs("use", "submit jobs")
    async def post(self) -> None:
        ident = self.identity
        try:
            body = self.json_body(
                {
                    "user": (str, False),
                    "offer": (str, True),
                    "class": (str, False),
                    "command": (list, True),
                    "name": (str, False),
                    "group": ((str, type(None)), False),
                    "groups": (list, False),
                    "env": ((dict, type(None)), False),
                    "cwd": ((str, type(None)), False),
                    "image": ((str, type(None)), False),
                    "replicas": (int, False),
                },
                long=("cwd", "image"),  # their own limits: 4,096 and 512 characters
            )
        except APIError as e:  # a command or environment missing or mistyped: the contract's 400
            if e.code in ("invalid_field", "missing_field") and e.field == "command":
                raise APIError("invalid_command", e.message, field="command") from None
            if e.code == "invalid_field" and e.field in ("env", "replicas"):
                raise APIError(f"invalid_{e.field}", e.message, field=e.field) from None
            raise
        user = body.get("user") or (ident.name if ident.kind == "user" else None)
        if not user:
            raise APIError("missing_field", "user is required for services", field="user")
        self.require(ident.may_use_for(user), f"submit jobs for {user}")
        groups = body.get("groups")
        if groups is not None and not all(isinstance(g, str) for g in groups):
            raise APIError("invalid_field", "groups must be a list of strings", field="groups")
        # users cannot claim groups they are not in; the spawner passes the user's groups
        member_of = groups if ident.is_spawner and groups is not None else list(ident.groups)
        try:
            job = await self.writer.run(
                commands.SubmitJob(
                    user,
                    body["offer"],
                    body.get("command") or [],
                    workload=body.get("class", "training"),
                    name=body.get("name", ""),
                    group=body.get("group"),
                    groups=member_of,
                    env=body.get("env"),
                    cwd=body.get("cwd"),
                    image=body.get("image"),
                    replicas=body.get("replicas", 1),
                    actor=ident.describe(),
                )
            )
        except PoolError as e:  # counted for capacity planning, as an allocation's are
            if e.code not in (
                "invalid_command",
                "invalid_env",
                "invalid_image",
                "invalid_replicas",
                "unknown_class",
            ):
                await self.writer.run(commands.RecordRefusal(body["offer"], e.code))
            raise
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{job.id}")
        self.write_json(job_json(job), 201)

    @needs("use", "list jobs")
    def get(self) -> None:
        ident = self.identity
        user = self.get_argument("user", None)
        if user is None and not ident.is_spawner:
            user = ident.name
        if user is not None:
            self.require(ident.may_use_for(user), f"see {user}'s jobs")
        state = self.get_argument("state", None) or None
        if state is not None and state not in JOB_STATES:
            raise APIError(
                "invalid_state", f"no job state {state!r}", field="state", allowed=JOB_STATES
            )
        jobs = self.store.list_jobs(user=user, state=state)
        self.write_json({"jobs": [job_json(j) for j in jobs]})


class JobHandler(_JobHandler):
    """``GET jobs/{id}`` and ``DELETE jobs/{id}`` (cancel)."""

    route_name = "job"

    @needs("use", "read jobs")
    def get(self, job_id: str) -> None:
        self._check(job_id)
        self.write_json(job_json(self.store.job(job_id)))

    @needs("use", "cancel jobs")
    async def delete(self, job_id: str) -> None:
        self._check(job_id)
        actor = self.identity.describe()
        self.write_json(job_json(await self.writer.run(commands.CancelJob(job_id, actor=actor))))


class JobLogsHandler(_JobHandler):
    """``GET jobs/{id}/logs?offset=N`` (the user reads) and ``POST jobs/{id}/logs`` (the
    runner uploads ``{offset, data}``)."""

    route_name = "job-logs"

    @needs("use-or-agent", "read job logs")
    def get(self, job_id: str) -> None:
        if not self.identity.is_agent:
            self._check(job_id)
        log = self.store.job_log(job_id, self.int_arg("offset", 0, high=2**62))
        self.write_json(job_log_json(log))

    @needs("agent", "upload job logs")
    async def post(self, job_id: str) -> None:
        body = self.json_body({"offset": (int, True), "data": (str, True)}, long=("data",))
        if body["offset"] < 0:
            raise APIError("invalid_field", "offset must be ≥ 0", field="offset")
        added = await self.writer.run(commands.AppendJobLog(job_id, body["offset"], body["data"]))
        self.write_json(job_log_appended_json(added))


class JobStatusHandler(APIHandler):
    """``POST jobs/{id}/status {state, exit_code?, pid?}``: the runner's report."""

    route_name = "job-status"

    @needs("agent", "report job status")
    async def post(self, job_id: str) -> None:
        body = self.json_body(
            {
                "state": (str, True),
                "exit_code": ((int, type(None)), False),
                "pid": ((int, type(None)), False),
            }
        )
        if body["state"] not in ("running", "exited"):
            raise APIError(
                "invalid_field",
                "state must be running or exited",
                field="state",
                allowed=["running", "exited"],
            )
        actor = self.identity.describe()
        job = await self.writer.run(
            commands.JobStatus(
                job_id, body["state"], body.get("exit_code"), body.get("pid"), actor=actor
            )
        )
        self.write_json(job_json(job))


class NodeJobsHandler(APIHandler):
    """``GET nodes/{name}/jobs``: what the node's runner should start, cancel or preempt."""

    route_name = "node-jobs"

    @needs("agent", "read a node's jobs")
    def get(self, name: str) -> None:
        self.write_json({"jobs": [job_json(j) for j in self.store.node_jobs(name)]})


default_handlers = [
    (r"jobs", JobsHandler),
    (r"jobs/([^/]+)", JobHandler),
    (r"jobs/([^/]+)/logs", JobLogsHandler),
    (r"jobs/([^/]+)/status", JobStatusHandler),
    (r"nodes/([^/]+)/jobs", NodeJobsHandler),
]
