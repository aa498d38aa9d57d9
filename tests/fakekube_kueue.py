"""What :class:`tests.fakes.FakeKubeAPI` serves of Kueue (``kueue.x-k8s.io/v1beta2``), and a
simulated Kueue controller for tests.

Served: AdmissionChecks (list), Workloads (list across namespaces, get, delete) and the
Workload's ``status`` subresource (JSON merge patch; 409 ``Conflict`` when the patch's
``metadata.resourceVersion`` is not the object's, as optimistic concurrency works on a real
server). A status patch is checked against Kueue's field names
(``status.admissionChecks[]``: ``name``, ``state`` ∈ Pending/Ready/Retry/Rejected, ``message``,
``lastTransitionTime``, ``podSetUpdates`` of ``name``, ``labels``, ``annotations``,
``nodeSelector``, ``tolerations``; https://kueue.sigs.k8s.io/docs/concepts/admission_check/):
anything else is a 422 ``Invalid``, as the CRD's schema would answer.

:func:`kueue_step` does what Kueue's own controllers do in the order a test needs: reserve
quota for an active Workload (``QuotaReserved``); admit one whose checks are all ``Ready``
(``Admitted``, the podSetUpdates recorded as applied); evict one with a ``Retry`` check
(``Evicted``, quota released, its checks back to ``Pending``) and deactivate one with a
``Rejected`` check.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

API = "/apis/kueue.x-k8s.io/v1beta2"
STATES = ("Pending", "Ready", "Retry", "Rejected")
CHECK_FIELDS = {"name", "state", "message", "lastTransitionTime", "podSetUpdates", "retryCount"}
UPDATE_FIELDS = {"name", "labels", "annotations", "nodeSelector", "tolerations"}
NOW = "2026-12-06T00:00:00Z"


def check_status(status: Any) -> str | None:
    """Why a Workload status patch is invalid (None: valid)."""
    if not isinstance(status, dict):
        return "status must be an object"
    for entry in status.get("admissionChecks") or ():
        extra = set(entry) - CHECK_FIELDS
        if extra:
            return f"status.admissionChecks: unknown fields {sorted(extra)}"
        if entry.get("state") not in STATES:
            return f"status.admissionChecks.state: Unsupported value: {entry.get('state')!r}"
        if not entry.get("name") or not entry.get("lastTransitionTime"):
            return "status.admissionChecks: name and lastTransitionTime are required"
        if len(entry.get("message") or "") > 32768:
            return "status.admissionChecks.message: Too long"
        for update in entry.get("podSetUpdates") or ():
            extra = set(update) - UPDATE_FIELDS
            if extra or not update.get("name"):
                return f"status.admissionChecks.podSetUpdates: invalid fields {sorted(extra)}"
            for key in ("labels", "annotations", "nodeSelector"):
                values = update.get(key) or {}
                if not all(isinstance(v, str) for v in values.values()):
                    return f"status.admissionChecks.podSetUpdates.{key}: values must be strings"
    return None


def admission_check(name: str, controller: str) -> dict[str, Any]:
    """An AdmissionCheck object."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": name, "uid": str(uuid.uuid4())},
        "spec": {"controllerName": controller},
    }


def workload(
    namespace: str,
    name: str,
    checks: list[str],
    labels: dict[str, str] | None = None,
    pod_sets: tuple[str, ...] = ("main",),
) -> dict[str, Any]:
    """A Workload as Kueue's job integration creates it (its checks listed, ``Pending``)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "labels": dict(labels or {}),
        },
        "spec": {
            "active": True,
            "queueName": "gpu",
            "podSets": [{"name": p, "count": 1, "template": {"spec": {}}} for p in pod_sets],
        },
        "status": {
            "conditions": [],
            "admissionChecks": [
                {"name": c, "state": "Pending", "message": "", "lastTransitionTime": NOW}
                for c in checks
            ],
        },
    }


def _set_condition(wl: dict[str, Any], kind: str, status: bool, reason: str, message: str) -> None:
    conds = [c for c in wl["status"]["conditions"] if c["type"] != kind]
    conds.append(
        {
            "type": kind,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": NOW,
        }
    )
    wl["status"]["conditions"] = conds


def _true(wl: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in wl["status"]["conditions"])


def add(fake: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Store an AdmissionCheck or Workload in the fake."""
    plural = "admissionchecks" if obj["kind"] == "AdmissionCheck" else "workloads"
    with fake._lock:
        fake._rv += 1
        obj["metadata"]["resourceVersion"] = str(fake._rv)
        fake.objects[(plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
    return obj


def get(fake: Any, namespace: str, name: str) -> dict[str, Any]:
    """A copy of a Workload."""
    with fake._lock:
        return copy.deepcopy(fake.objects[("workloads", namespace, name)])


def kueue_step(fake: Any) -> None:
    """One round of the simulated Kueue over every Workload."""
    with fake._lock:
        for (plural, _, _), wl in fake.objects.items():
            if plural != "workloads" or _true(wl, "Finished"):
                continue
            before = json.dumps(wl, sort_keys=True)
            checks = wl["status"]["admissionChecks"]
            states = {c["state"] for c in checks}
            if "Rejected" in states and wl["spec"]["active"]:
                wl["spec"]["active"] = False
                _set_condition(wl, "QuotaReserved", False, "Deactivated", "check rejected")
                _set_condition(wl, "Admitted", False, "Deactivated", "check rejected")
                _set_condition(wl, "Evicted", True, "Deactivated", "an admission check rejected")
            elif "Retry" in states:
                _set_condition(wl, "QuotaReserved", False, "Pending", "evicted")
                _set_condition(wl, "Admitted", False, "Evicted", "evicted")
                _set_condition(wl, "Evicted", True, "AdmissionCheck", "admission check Retry")
                for c in checks:
                    c.update(state="Pending", message="Reset to Pending after eviction")
                    c.pop("podSetUpdates", None)
                wl["status"].pop("appliedPodSetUpdates", None)
            elif not wl["spec"]["active"]:
                pass
            elif not _true(wl, "QuotaReserved"):
                _set_condition(wl, "QuotaReserved", True, "QuotaReserved", "quota reserved")
                _set_condition(wl, "Evicted", False, "QuotaReserved", "requeued")
            elif states == {"Ready"} and not _true(wl, "Admitted"):
                _set_condition(wl, "Admitted", True, "Admitted", "admitted")
                wl["status"]["appliedPodSetUpdates"] = [
                    u for c in checks for u in c.get("podSetUpdates") or ()
                ]
            if json.dumps(wl, sort_keys=True) != before:
                fake._rv += 1
                wl["metadata"]["resourceVersion"] = str(fake._rv)


def finish(fake: Any, namespace: str, name: str, ok: bool = True) -> None:
    """The Workload's job ended (Kueue's ``Finished`` condition)."""
    with fake._lock:
        wl = fake.objects[("workloads", namespace, name)]
        reason = "Succeeded" if ok else "Failed"
        _set_condition(wl, "Finished", True, reason, "" if ok else "Job failed: BackoffLimit")
        fake._rv += 1
        wl["metadata"]["resourceVersion"] = str(fake._rv)


def routes(fake: Any, base: type) -> list[tuple[str, type]]:
    """The Kueue routes of :class:`FakeKubeAPI`."""

    class Kueue(base):  # type: ignore[misc, valid-type]
        def prepare(self) -> None:
            super().prepare()
            if self._finished:
                fake.unauthorized += 1
            else:
                fake.calls.append((self.request.method, self.request.path))

        def listing(self, plural: str, kind: str) -> None:
            with fake._lock:
                items = [copy.deepcopy(o) for (p, _, _), o in fake.objects.items() if p == plural]
                rv = fake._rv
            self.finish(
                {
                    "kind": kind,
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                }
            )

    class Checks(Kueue):
        def get(self) -> None:
            self.listing("admissionchecks", "AdmissionCheckList")

    class Workloads(Kueue):
        def get(self) -> None:
            self.listing("workloads", "WorkloadList")

    class OneWorkload(Kueue):
        def found(self, namespace: str, name: str) -> dict[str, Any] | None:
            wl = fake.objects.get(("workloads", namespace, name))
            if wl is None:
                self.status(404, "NotFound", f'workloads.kueue.x-k8s.io "{name}" not found')
            return wl

        def get(self, namespace: str, name: str) -> None:
            with fake._lock:
                wl = copy.deepcopy(self.found(namespace, name))
            if wl is not None:
                self.finish(wl)

        def delete(self, namespace: str, name: str) -> None:
            with fake._lock:
                wl = fake.objects.pop(("workloads", namespace, name), None)
            if wl is None:
                self.status(404, "NotFound", f'workloads.kueue.x-k8s.io "{name}" not found')
            else:
                self.finish(wl)

    class Status(OneWorkload):
        def patch(self, namespace: str, name: str) -> None:
            if self.request.headers.get("Content-Type") != "application/merge-patch+json":
                self.status(415, "UnsupportedMediaType", "merge-patch+json only")
                return
            body = json.loads(self.request.body)
            with fake._lock:
                wl = self.found(namespace, name)
                if wl is None:
                    return
                want = (body.get("metadata") or {}).get("resourceVersion")
                if want and want != wl["metadata"]["resourceVersion"]:
                    self.status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on workloads.kueue.x-k8s.io "{name}": '
                        "the object has been modified; please apply your changes to the "
                        "latest version and try again",
                    )
                    return
                if set(body) - {"metadata", "status"}:
                    self.status(422, "Invalid", "a status patch changes status only")
                    return
                invalid = check_status(body.get("status"))
                if invalid:
                    self.status(422, "Invalid", f'Workload "{name}" is invalid: {invalid}')
                    return
                wl["status"] = fake_merge(wl["status"], body.get("status") or {})
                fake._rv += 1
                wl["metadata"]["resourceVersion"] = str(fake._rv)
                out = copy.deepcopy(wl)
            self.finish(out)

    return [
        (rf"{API}/admissionchecks", Checks),
        (rf"{API}/workloads", Workloads),
        (rf"{API}/namespaces/([^/]+)/workloads/([^/]+)", OneWorkload),
        (rf"{API}/namespaces/([^/]+)/workloads/([^/]+)/status", Status),
    ]


def fake_merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    from tests.fakes.kube import _merge_patch

    return _merge_patch(target, patch)
