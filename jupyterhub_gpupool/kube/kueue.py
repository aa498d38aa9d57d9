"""The pool as a Kueue AdmissionCheck controller: a Kueue Workload that carries the pool's
check is admitted only once the pool grants it a job lease (issue 35, item 5).

Each housekeeping round (leader only) lists the AdmissionChecks whose ``spec.controllerName``
is ``controller_name`` and every Workload naming one of them in ``status.admissionChecks``.
For a Workload whose quota Kueue reserved (``QuotaReserved``), the pool submits a job
(``KueueJob``: offer and class from the Workload's labels, user from its namespace; a Workload
without either label is rejected, naming the label, unless ``default_offer`` /
``default_class`` is set) and sets the check: ``Ready`` with ``podSetUpdates`` that pin every
pod set to the granted node (and name the lease and devices); ``Pending`` with the queue
position while the lease waits; ``Rejected`` with the pool's refusal. A training job the pool
preempts goes ``preempting`` (its notice) while the check stays ``Ready``; once the class's
grace has passed the check goes ``Retry``, which makes Kueue evict the Workload (its pods get
SIGTERM from Kubernetes). A Workload that finished, was evicted or deleted ends its job
(``EndKubeJob``). Every write is a merge patch of the Workload's status at the
``resourceVersion`` just read; a conflict is tried again next round.

Exact devices with Dynamic Resource Allocation (``device_backend = "dra"``): Kueue's
``podSetUpdates`` carry labels, annotations, a nodeSelector and tolerations, never a claim, so
a Workload asks for its exact devices by referencing, in its pod template, a ResourceClaim whose
name starts with ``gpupool-`` (``resourceClaimName``). Before the check turns ``Ready`` the pool
creates that claim in the Workload's namespace with one exact CEL request per granted device
(``kube/draselect.py``); the pods Kueue lets start use it, so the device the pool chose is the
device they get. The claim is deleted once its job is no longer live. Pods of one pod set share
a claim, so such a pod set has ``count: 1``; a Workload references at most one such claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from traitlets import Bool, Dict, Enum, Unicode
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..store.errors import StoreError
from ..store.read.jobs import JobView
from ..timeparse import format_time
from .client import KubeError
from .draselect import API_VERSION as DRA_VERSION
from .draselect import devices_claim
from .settings import OneAPIServer, api_traits

log = logging.getLogger("jupyterhub_gpupool.kube")

Call = Callable[[commands.Command], Awaitable[Any]]

CONTROLLER = "gpupool.jupyter.org/admission"
OFFER_LABEL = "gpupool.jupyter.org/offer"
CLASS_LABEL = "gpupool.jupyter.org/class"
LEASE_LABEL = "gpupool.jupyter.org/lease"
JOB_LABEL = "gpupool.jupyter.org/job"
DEVICES_ANNOTATION = "gpupool.jupyter.org/devices"
#: A pod template's ``resourceClaimName`` with this prefix is a claim the pool makes.
CLAIM_PREFIX = "gpupool-"
MANAGED = {"app.kubernetes.io/managed-by": "jupyterhub-gpupool"}


def condition(workload: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The Workload's condition of type ``kind`` when it is ``True``."""
    for c in (workload.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def devices_of(job: JobView) -> list[str]:
    """The granted devices' ids: a MIG instance's uuid once made, else the GPU's."""
    return [(d.mig.uuid if d.mig is not None else None) or d.gpu for d in job.devices]


def job_slots(job: JobView) -> list[dict[str, Any]]:
    """The job's granted devices as the slots its claim selects (``draselect.devices_claim``):
    a MIG instance by its GPU, profile and start, else the whole GPU."""
    return [
        {"kind": "mig", "gpu": d.gpu, "profile": d.mig.profile, "start": d.mig.start}
        if d.mig is not None
        else {"kind": "gpu", "gpu": d.gpu}
        for d in job.devices
    ]


def pod_set_updates(
    workload: Mapping[str, Any], job: JobView, node_label: str
) -> list[dict[str, Any]]:
    """For every pod set: a nodeSelector for the granted node, labels naming the lease and
    the job, an annotation naming the devices. (The device plugin picks the GPU on the node
    from the pod's ``nvidia.com/*`` limit; the pool's ``Rebind`` follows it.)"""
    return [
        {
            "name": str(ps.get("name", "main")),
            "labels": {LEASE_LABEL: str(job.lease_id), JOB_LABEL: job.id},
            "annotations": {DEVICES_ANNOTATION: ",".join(devices_of(job))},
            "nodeSelector": {node_label: str(job.node)},
        }
        for ps in (workload.get("spec") or {}).get("podSets") or ({"name": "main"},)
    ]


def pool_claim(workload: Mapping[str, Any]) -> str | None:
    """The name of the claim the Workload's pod templates ask the pool to make (None: none).
    Raises ``ValueError`` for more than one, or for one in a pod set of several pods."""
    names = set()
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        spec = (ps.get("template") or {}).get("spec") or {}
        mine = {
            str(ref["resourceClaimName"])
            for ref in spec.get("resourceClaims") or ()
            if str(ref.get("resourceClaimName") or "").startswith(CLAIM_PREFIX)
        }
        if mine and int(ps.get("count", 1)) != 1:
            raise ValueError(
                f"pod set {ps.get('name')} has {ps.get('count')} pods sharing claim "
                f"{', '.join(sorted(mine))}: a pool claim's pod set has count 1"
            )
        names |= mine
    if len(names) > 1:
        raise ValueError(f"the workload references {len(names)} pool claims "
                         f"({', '.join(sorted(names))}): at most one")  # fmt: skip
    return next(iter(names), None)


def _time(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KueueAdmission(OneAPIServer, LoggingConfigurable):
    """The AdmissionCheck controller (``c.KueueAdmission`` in the service's config)."""

    enabled = Bool(
        False,
        help="Act as the Kueue AdmissionCheck controller named controller_name: every "
        "housekeeping round, admit Workloads that carry its check only when the pool grants "
        "them a job lease (see the Kueue how-to). Needs list on admissionchecks and workloads "
        "and patch on workloads/status (the Helm chart's kueue.enabled grants them).",
    ).tag(config=True)
    controller_name = Unicode(
        CONTROLLER,
        help="The spec.controllerName of the AdmissionChecks this pool answers.",
    ).tag(config=True)
    namespace_users = Dict(
        value_trait=Unicode(),
        help="Namespace → the pool user its Workloads are charged to. A namespace not listed "
        "is its own user's (e.g. one namespace per user); a Workload's labels never choose "
        "its user.",
    ).tag(config=True)
    default_offer = Unicode(
        "",
        help="The offer of a Workload without the gpupool.jupyter.org/offer label (empty: such "
        "a Workload is rejected).",
    ).tag(config=True)
    default_class = Unicode(
        "",
        help="The workload class of a Workload without the gpupool.jupyter.org/class label "
        "(empty: such a Workload is rejected; e.g. `training` admits it as a preemptible "
        "training job).",
    ).tag(config=True)
    node_label = Unicode(
        "kubernetes.io/hostname",
        help="Node label whose value is the pool's node name: the podSetUpdates' nodeSelector.",
    ).tag(config=True)
    device_backend = Enum(
        ("device-plugin", "dra"),
        "device-plugin",
        help="`dra` (Kubernetes 1.34+ with NVIDIA's DRA driver): make the ResourceClaim a "
        "Workload's pod template references by a name starting with `gpupool-`, selecting "
        "exactly the granted devices, before admitting it, and delete it when its job ends "
        "(needs create, list and delete on resourceclaims). `device-plugin`: the pods' "
        "nvidia.com/* limits on the granted node; the plugin picks the devices.",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()

    async def step(self, store: Any, call: Call) -> dict[str, str]:
        """One round; returns each changed Workload's (``namespace/name``) new check state
        (for logs and tests). An unreachable API server changes nothing."""
        try:
            checks = {
                c["metadata"]["name"]
                for c in await self.client().list_admission_checks()
                if (c.get("spec") or {}).get("controllerName") == self.controller_name
            }
            workloads = await self.client().list_workloads() if checks else []
        except KubeError as e:
            log.warning("Kubernetes API (Kueue): %s", e)
            return {}
        jobs: dict[str | None, JobView] = {
            (j.runner_ref or {}).get("uid"): j for j in store.kueue_jobs()
        }
        seen: set[str] = set()
        out: dict[str, str] = {}
        for wl in workloads:
            meta = wl.get("metadata") or {}
            entries = (wl.get("status") or {}).get("admissionChecks") or []
            mine = next((e for e in entries if e.get("name") in checks), None)
            if mine is None:
                continue
            seen.add(str(meta.get("uid")))
            try:
                state = await self._one(store, call, wl, mine, jobs.get(meta.get("uid")))
            except StoreError as e:  # e.g. the job ended meanwhile: next round sees it
                log.warning("Kueue workload %s/%s: %s", meta.get("namespace"), meta["name"], e)
                continue
            if state:
                out[f"{meta.get('namespace')}/{meta['name']}"] = state
        for uid, job in jobs.items():
            if uid not in seen and checks:  # its Workload is gone
                await call(commands.EndKubeJob(job.id, "deleted", "workload deleted"))
                out[job.name] = "deleted"
        if self.device_backend == "dra":
            await self._delete_claims({j.id for j in store.kueue_jobs()})
        return out

    async def _delete_claims(self, live: set[str]) -> None:
        """Delete the claims the pool made for Workloads whose job is no longer live."""
        try:
            for claim in await self.client().list_resource_claims():
                meta = claim.get("metadata") or {}
                job_id = (meta.get("labels") or {}).get(JOB_LABEL)
                if (
                    not job_id
                    or job_id in live
                    or not str(meta.get("name")).startswith(CLAIM_PREFIX)
                ):
                    continue
                path = f"/apis/{DRA_VERSION}/namespaces/{meta['namespace']}/resourceclaims"
                try:
                    await self.client().delete(f"{path}/{meta['name']}")
                except KubeError as e:
                    if e.status != 404:
                        raise
        except KubeError as e:
            log.warning("Kubernetes API (Kueue claims): %s", e)

    async def _make_claim(self, wl: Mapping[str, Any], job: JobView) -> str | None:
        """Make the Workload's pool claim (``dra``) for its granted devices; the refusal's
        message if it asks for one wrongly."""
        try:
            name = pool_claim(wl)
        except ValueError as e:
            return str(e)
        if name is None or self.device_backend != "dra":
            return None
        namespace = str(wl["metadata"]["namespace"])
        labels = {**MANAGED, JOB_LABEL: job.id, LEASE_LABEL: str(job.lease_id)}
        body = devices_claim(job_slots(job), name, namespace, labels)
        try:
            await self.client().create(
                f"/apis/{DRA_VERSION}/namespaces/{namespace}/resourceclaims", body
            )
        except KubeError as e:
            if e.status != 409:
                raise
        return None

    async def _one(
        self,
        store: Any,
        call: Call,
        wl: dict[str, Any],
        check: dict[str, Any],
        job: JobView | None,
    ) -> str | None:
        meta = wl["metadata"]
        finished = condition(wl, "Finished")
        if job is not None:
            if finished is not None:
                ok = finished.get("reason") == "Succeeded"
                message = "" if ok else str(finished.get("message") or "")
                await call(commands.EndKubeJob(job.id, "succeeded" if ok else "failed", message))
                return "finished"
            # admitted once (running), it lost its quota or Kueue reset the check to Pending:
            # Kueue evicted it (after the pool's Retry or Rejected, or for reasons of its own)
            admitted_once = job.state in ("running", "preempting", "cancelling")
            if admitted_once and (
                check.get("state") == "Pending" or condition(wl, "QuotaReserved") is None
            ):
                evicted = condition(wl, "Evicted") or {}
                why = str(evicted.get("message") or "evicted by Kueue")
                await call(commands.EndKubeJob(job.id, "evicted", why))
                return "evicted"
            if job.state == "granted" and condition(wl, "Admitted") is not None:
                job = await call(commands.JobStatus(job.id, "running"))
            return await self._answer(store, call, wl, check, job)
        if finished is not None or condition(wl, "QuotaReserved") is None:
            return None  # Kueue has not reserved quota yet, or it is over
        if check.get("state") == "Ready":  # its job ended in the pool (cancelled, released):
            # Kueue evicts it, and asks again (a job cancelled in the pool rejects it then)
            return await self._set(wl, check, "Retry", "GPU pool: the job's lease ended", None)
        if check.get("state", "Pending") != "Pending":
            return None  # answered (Rejected stays; Retry: Kueue resets it to Pending)
        labels = meta.get("labels") or {}
        namespace = str(meta.get("namespace") or "default")
        try:
            pool_claim(wl)
        except ValueError as e:  # before asking the pool: no lease for a Workload it rejects
            return await self._set(wl, check, "Rejected", f"GPU pool: {e}", None)
        offer = labels.get(OFFER_LABEL) or self.default_offer
        if not offer:
            return await self._set(
                wl, check, "Rejected", f"no offer: label the workload with {OFFER_LABEL}", None
            )
        cls = labels.get(CLASS_LABEL) or self.default_class
        if not cls:
            why = f"no class: label the workload with {CLASS_LABEL} (e.g. training)"
            return await self._set(wl, check, "Rejected", why, None)
        try:
            job = await call(
                commands.KueueJob(
                    self.namespace_users.get(namespace, namespace),
                    offer,
                    cls,
                    namespace,
                    str(meta["name"]),
                    str(meta["uid"]),
                )
            )
        except StoreError as e:
            return await self._set(wl, check, "Rejected", f"GPU pool: {e}", None)
        return await self._answer(store, call, wl, check, job)

    async def _answer(
        self, store: Any, call: Call, wl: dict[str, Any], check: dict[str, Any], job: JobView
    ) -> str | None:
        """Set the check for the job's state; before ``Ready``, make the Workload's claim (a
        Workload asking for one wrongly is rejected and its job cancelled)."""
        state, message, updates = self._wanted(store, wl, job)
        if state == "Ready":
            wrong = await self._make_claim(wl, job)
            if wrong is not None:
                await call(commands.CancelJob(job.id))
                return await self._set(wl, check, "Rejected", f"GPU pool: {wrong}", None)
        return await self._set(wl, check, state, message, updates)

    def _wanted(
        self, store: Any, wl: dict[str, Any], job: JobView
    ) -> tuple[str, str, list[dict[str, Any]] | None]:
        """The check's state, message and podSetUpdates for the job's state."""
        state = job.state
        if state == "queued":
            where = f"queued for {job.offer}, position {job.position}"
            return "Pending", f"GPU pool: {where}", None
        if state == "cancelling":
            return "Rejected", f"GPU pool: job {job.id} cancelled", None
        if state == "cancelled":
            return "Rejected", f"GPU pool: {job.reason or 'cancelled'}", None
        updates = pod_set_updates(wl, job, self.node_label)
        node = f"GPU pool: lease {job.lease_id} on {job.node}"
        if state == "preempting":
            deadline = job.notice_deadline
            if deadline is None or store.clock() >= deadline:
                return "Retry", f"GPU pool: preempted ({job.reason or 'notice'})", None
            until = format_time(deadline)
            return "Ready", f"{node}; preempting, notice until {until}", updates
        return "Ready", node, updates

    async def _set(
        self,
        wl: dict[str, Any],
        check: dict[str, Any],
        state: str,
        message: str,
        updates: list[dict[str, Any]] | None,
    ) -> str | None:
        """Patch the check when its state, message or podSetUpdates change."""
        same = (
            check.get("state") == state
            and check.get("message") == message
            and (check.get("podSetUpdates") or None) == updates
        )
        if same:
            return None
        entry = {**check, "state": state, "message": message}
        if updates:
            entry["podSetUpdates"] = updates
        else:
            entry.pop("podSetUpdates", None)
        if check.get("state") != state or not check.get("lastTransitionTime"):
            entry["lastTransitionTime"] = _time(datetime.now(timezone.utc))
        meta = wl["metadata"]
        entries = [
            entry if e.get("name") == check["name"] else e
            for e in wl["status"].get("admissionChecks") or ()
        ]
        try:
            await self.client().patch_workload_status(
                str(meta["namespace"]),
                str(meta["name"]),
                {"admissionChecks": entries},
                str(meta.get("resourceVersion") or ""),
            )
        except KubeError as e:
            log.warning("Kueue workload %s/%s: %s", meta["namespace"], meta["name"], e)
            return None
        log.info("Kueue workload %s/%s: %s (%s)", meta["namespace"], meta["name"], state, message)
        return state
