"""Jobs Kubernetes runs without Kueue: for a job submitted with an ``image``, the pool creates
a ``batch/v1`` Job (an ``apps/v1`` Deployment for class ``inference``) once its lease is
granted, pinned like the spawner pins a server (issue 35, item 5).

Two ways to pin, as for servers (``device_backend``): the device plugin's limit on the granted
node (the plugin picks which of the node's devices; the pool's count on that node stays true),
or, with Dynamic Resource Allocation, a ResourceClaim named like the object whose requests
select exactly the granted devices by CEL (a GPU by ``uuid``, a MIG slice by parent, profile
and memory slice: ``kube/draselect.py``), referenced by the pods, so the device the pool chose is
the device the job gets. The claim is deleted with the object, and when the job ends.

Each housekeeping round (leader only) lists the pool's Jobs and Deployments in ``namespace``
(label ``gpupool.jupyter.org/job``) and the live jobs whose runner is ``kubernetes``: a granted
job without its object gets one (nodeSelector for the granted node, the device plugin's
``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` limit for the granted devices); a pod running
→ the job ``running``; the Job ``Complete``/``Failed`` → ``succeeded``/``failed``; a cancelled
job, or a preempted one past its notice deadline, has its object deleted (the pods get SIGTERM,
then SIGKILL after their grace) and ends. An object whose job ended another way (an admin's
release) is deleted, so nothing holds a GPU the pool no longer grants.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from traitlets import Bool, Enum, Unicode
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..store.read.jobs import JobView
from .client import KubeError
from .draselect import API_VERSION as DRA_VERSION
from .draselect import devices_claim
from .kueue import DEVICES_ANNOTATION, JOB_LABEL, LEASE_LABEL, devices_of, job_slots
from .settings import OneAPIServer, api_traits

log = logging.getLogger("jupyterhub_gpupool.kube")

Call = Callable[[commands.Command], Awaitable[Any]]
RUNNER = "kubernetes"
MANAGED = {"app.kubernetes.io/managed-by": "jupyterhub-gpupool"}
#: ``KubeJobs.device_backend`` values.
BACKENDS = ("device-plugin", "dra")
#: The pods' name for the job's claim (``spec.resourceClaims[].name``).
CLAIM_REF = "gpu"


def object_name(job_id: str) -> str:
    """The Job's or Deployment's name (a DNS label)."""
    return f"gpupool-job-{job_id[:20]}"


def gpu_limits(job: JobView) -> dict[str, str]:
    """The device plugin's resources for one replica's share of the granted devices (all of
    them for a job of one): a MIG instance by its profile, a whole GPU as ``nvidia.com/gpu``."""
    out: dict[str, int] = {}
    for d in job.devices:
        key = f"nvidia.com/mig-{d.mig.profile}" if d.mig and d.mig.profile else "nvidia.com/gpu"
        out[key] = out.get(key, 0) + 1
    replicas = max(1, job.replicas)
    return {k: str(max(1, v // replicas)) for k, v in out.items()}


def _labels(job: JobView) -> dict[str, str]:
    return {**MANAGED, JOB_LABEL: job.id, LEASE_LABEL: str(job.lease_id)}


def job_claim(job: JobView, namespace: str) -> dict[str, Any]:
    """The ResourceClaim (``resource.k8s.io/v1``) of the job's granted devices, each selected
    exactly; named like the job's object."""
    return devices_claim(job_slots(job), object_name(job.id), namespace, _labels(job))


def uses_claim(job: JobView, backend: str) -> bool:
    """Whether the job's pods use its claim: with ``dra``, for a job of one replica (the pods
    of a Deployment share one claim, so replicas would share its devices: several replicas get
    the device plugin's limit of one copy each, on the granted node)."""
    return backend == "dra" and max(1, job.replicas) == 1


def manifest(
    job: JobView, namespace: str, node_label: str, backend: str = "device-plugin"
) -> dict[str, Any]:
    """The Job (or, for class ``inference``, the Deployment) that runs ``job``; with ``dra``
    its pods use the job's claim (:func:`job_claim`, :func:`uses_claim`) instead of the device
    plugin's limit."""
    name = object_name(job.id)
    claim = uses_claim(job, backend)
    labels = _labels(job)
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {DEVICES_ANNOTATION: ",".join(devices_of(job))},
    }
    env = [{"name": k, "value": v} for k, v in sorted((job.env or {}).items())]
    env.append({"name": "GPUPOOL_JOB_ID", "value": job.id})
    container: dict[str, Any] = {
        "name": "job",
        "image": str((job.runner_ref or {})["image"]),
        "env": env,
        "resources": ({"claims": [{"name": CLAIM_REF}]} if claim else {"limits": gpu_limits(job)}),
    }
    if job.command:
        container["command"] = list(job.command)
    inference = job.workload == "inference"
    pod: dict[str, Any] = {
        "metadata": {"labels": labels, "annotations": meta["annotations"]},
        "spec": {
            "restartPolicy": "Always" if inference else "Never",
            "nodeSelector": {node_label: str(job.node)},
            "containers": [container],
        },
    }
    if claim:
        pod["spec"]["resourceClaims"] = [{"name": CLAIM_REF, "resourceClaimName": name}]
    if inference:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": max(1, job.replicas),
                "selector": {"matchLabels": {JOB_LABEL: job.id}},
                "template": pod,
            },
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400, "template": pod},
    }


def _finished(obj: Mapping[str, Any]) -> str | None:
    """``succeeded`` or ``failed`` for a Job the Job controller finished."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return "succeeded" if c["type"] == "Complete" else "failed"
    return None


def _runs(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("active") or status.get("availableReplicas"))


class KubeJobs(OneAPIServer, LoggingConfigurable):
    """Runs jobs submitted with an ``image`` as Kubernetes Jobs/Deployments (``c.KubeJobs``)."""

    enabled = Bool(
        False,
        help="Run jobs submitted with an image (POST /jobs `image`) as batch/v1 Jobs (apps/v1 "
        "Deployments for class inference) in namespace, created once their lease is granted and "
        "pinned to the granted node and devices. Needs create, list and delete on jobs and "
        "deployments in that namespace.",
    ).tag(config=True)
    namespace = Unicode("default", help="The namespace the pool creates jobs in.").tag(config=True)
    node_label = Unicode(
        "kubernetes.io/hostname",
        help="Node label whose value is the pool's node name: the pods' nodeSelector.",
    ).tag(config=True)
    device_backend = Enum(
        BACKENDS,
        "device-plugin",
        help="How the pods are pinned to the granted devices: `device-plugin` (nodeSelector for "
        "the granted node and the plugin's nvidia.com/gpu or nvidia.com/mig-<profile> limit; the "
        "plugin picks which device of the node) or `dra` (Kubernetes 1.34+ with NVIDIA's DRA "
        "driver: a ResourceClaim selecting exactly the granted devices, created with the object "
        "and deleted with it; needs create, list and delete on resourceclaims in namespace).",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()

    def _path(self, plural: str, name: str = "") -> str:
        if plural == "resourceclaims":
            group = f"/apis/{DRA_VERSION}"
        else:
            group = "/apis/apps/v1" if plural == "deployments" else "/apis/batch/v1"
        tail = f"/{name}" if name else ""
        return f"{group}/namespaces/{self.namespace}/{plural}{tail}"

    async def step(self, store: Any, call: Call) -> dict[str, str]:
        """One round; returns what happened per job id (for logs and tests)."""
        client = self.client()
        selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
        try:
            found: dict[str, tuple[str, dict[str, Any]]] = {}
            for plural in ("jobs", "deployments"):
                for obj in await client.list_at(self._path(plural), selector):
                    job_id = ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL)
                    if job_id:
                        found[job_id] = (plural, obj)
        except KubeError as e:
            log.warning("Kubernetes API (jobs): %s", e)
            return {}
        out: dict[str, str] = {}
        live = {j.id: j for j in store.runner_jobs(RUNNER)}
        for job_id, (plural, obj) in found.items():
            if job_id not in live and (plural == "deployments" or not _finished(obj)):
                out[job_id] = await self._delete(plural, obj)  # its lease ended another way
        if self.device_backend == "dra":
            try:  # a claim whose job ended (or never got its object) holds devices: delete it
                for claim in await client.list_at(self._path("resourceclaims"), selector):
                    job_id = ((claim.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL)
                    if job_id and job_id not in live:
                        await self._delete("resourceclaims", claim)
            except KubeError as e:
                log.warning("Kubernetes API (job claims): %s", e)
        for job in live.values():
            try:
                done = await self._one(store, call, job, found.get(job.id))
            except KubeError as e:
                log.warning("Kubernetes job %s: %s", job.id, e)
                continue
            if done:
                out[job.id] = done
        return out

    async def _one(
        self, store: Any, call: Call, job: JobView, have: tuple[str, dict[str, Any]] | None
    ) -> str | None:
        state = job.state
        if state == "queued":
            return None
        plural, obj = have if have is not None else ("", {})
        deadline = job.notice_deadline
        due = state == "preempting" and (deadline is None or store.clock() >= deadline)
        if state == "cancelling" or due:
            if have is not None:
                await self._delete(plural, obj)
            await self._delete_claim(job)
            outcome = "evicted" if due else "deleted"
            await call(commands.EndKubeJob(job.id, outcome))
            return "preempted" if due else "cancelled"
        if have is None:
            if state == "granted":
                body = manifest(job, self.namespace, self.node_label, self.device_backend)
                plural = "deployments" if body["kind"] == "Deployment" else "jobs"
                if uses_claim(job, self.device_backend):
                    await self._create_claim(job)
                await self.client().create(self._path(plural), body)
                return "created"
            await self._delete_claim(job)
            await call(commands.EndKubeJob(job.id, "deleted", "deleted in Kubernetes"))
            return "deleted"
        finished = _finished(obj)
        if finished is not None:
            await self._delete_claim(job)
            await call(commands.EndKubeJob(job.id, finished))
            return finished
        if state == "granted" and _runs(obj):
            await call(commands.JobStatus(job.id, "running"))
            return "running"
        return None

    async def _create_claim(self, job: JobView) -> None:
        """The job's claim; one left by a round that failed before its object is kept."""
        try:
            await self.client().create(self._path("resourceclaims"), job_claim(job, self.namespace))
        except KubeError as e:
            if e.status != 409:
                raise

    async def _delete_claim(self, job: JobView) -> None:
        if self.device_backend == "dra":
            await self._delete("resourceclaims", {"metadata": {"name": object_name(job.id)}})

    async def _delete(self, plural: str, obj: Mapping[str, Any]) -> str:
        try:
            await self.client().delete(self._path(plural, str(obj["metadata"]["name"])))
        except KubeError as e:
            if e.status != 404:
                raise
        return "deleted"
