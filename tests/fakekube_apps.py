"""What :class:`tests.fakes.FakeKubeAPI` serves of ``batch/v1`` Jobs and ``apps/v1``
Deployments: create (409 ``AlreadyExists``; a body kubernetes-validate refuses is a 422
``Invalid``, as the API server's schema check answers), list with a label selector, get and
delete (404 ``NotFound``). The Job controller and the Deployment controller are simulated by
the test (:func:`job_runs`, :func:`job_ends`, :func:`deployment_available`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

GROUPS = {"jobs": ("batch/v1", "Job"), "deployments": ("apps/v1", "Deployment")}
#: Kubernetes versions every created object must validate for.
VALIDATE_FOR = ("1.30", "1.35")
#: ... and those an object whose pods use ResourceClaims must (DRA is GA from 1.34; the pod's
#: ``resourceClaimName`` took its place in 1.31).
VALIDATE_DRA_FOR = ("1.34", "1.35")


def problems(obj: dict[str, Any]) -> str | None:
    """What the API server's schema would refuse (kubernetes-validate, strict)."""
    try:
        import kubernetes_validate
    except ImportError:  # the test extra's kubernetes-validate is not installed
        return None
    template = (obj.get("spec") or {}).get("template") or {}
    dra = bool((template.get("spec") or {}).get("resourceClaims"))
    for version in VALIDATE_DRA_FOR if dra else VALIDATE_FOR:
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), desired_version=version, strict=True)
        except kubernetes_validate.ValidationError as e:
            return f"{version}: {e.message}"
    return None


def _bump(fake: Any, obj: dict[str, Any]) -> None:
    fake._rv += 1
    obj["metadata"]["resourceVersion"] = str(fake._rv)


def job_runs(fake: Any, namespace: str, name: str) -> None:
    """The Job's pod runs (``status.active``)."""
    with fake._lock:
        job = fake.objects[("jobs", namespace, name)]
        job["status"] = {"active": 1, "startTime": "2026-12-06T00:00:00Z"}
        _bump(fake, job)


def job_ends(fake: Any, namespace: str, name: str, ok: bool = True) -> None:
    """The Job completes (``Complete``) or fails (``Failed``), as the Job controller says."""
    with fake._lock:
        job = fake.objects[("jobs", namespace, name)]
        kind = "Complete" if ok else "Failed"
        job["status"] = {
            "succeeded" if ok else "failed": 1,
            "conditions": [
                {"type": kind, "status": "True", "reason": "BackoffLimitExceeded" if not ok else ""}
            ],
        }
        _bump(fake, job)


def deployment_available(fake: Any, namespace: str, name: str) -> None:
    """The Deployment's replica is available."""
    with fake._lock:
        dep = fake.objects[("deployments", namespace, name)]
        dep["status"] = {"replicas": 1, "availableReplicas": 1, "readyReplicas": 1}
        _bump(fake, dep)


def routes(fake: Any, base: type) -> list[tuple[str, type]]:
    """The ``/apis/{batch/v1,apps/v1}/namespaces/{ns}/{jobs,deployments}`` routes."""

    class Apps(base):  # type: ignore[misc, valid-type]
        def prepare(self) -> None:
            super().prepare()
            if self._finished:
                fake.unauthorized += 1
            else:
                fake.calls.append((self.request.method, self.request.path))

    class Collection(Apps):
        def get(self, group: str, namespace: str, plural: str) -> None:
            want = dict(
                p.split("=", 1) for p in self.get_argument("labelSelector", "").split(",") if p
            )
            with fake._lock:
                items = [
                    copy.deepcopy(o)
                    for (p, ns, _), o in fake.objects.items()
                    if p == plural
                    and ns == namespace
                    and all(
                        (o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items()
                    )
                ]
            self.finish({"kind": f"{GROUPS[plural][1]}List", "apiVersion": group, "items": items})

        def post(self, group: str, namespace: str, plural: str) -> None:
            body = json.loads(self.request.body)
            if (body.get("apiVersion"), body.get("kind")) != GROUPS[plural]:
                self.status(400, "BadRequest", f"expected {GROUPS[plural]}")
                return
            invalid = problems(body)
            if invalid:
                self.status(422, "Invalid", f"{GROUPS[plural][1]} is invalid: {invalid}")
                return
            with fake._lock:
                key = (plural, namespace, body["metadata"]["name"])
                if key in fake.objects:
                    self.status(409, "AlreadyExists", f'{plural} "{key[2]}" already exists')
                    return
                body["metadata"].update(namespace=namespace, uid=f"uid-{fake._rv}")
                body["status"] = {}
                _bump(fake, body)
                fake.objects[key] = body
                out = copy.deepcopy(body)
            self.set_status(201)
            self.finish(out)

    class Item(Apps):
        def get(self, group: str, namespace: str, plural: str, name: str) -> None:
            with fake._lock:
                found = copy.deepcopy(fake.objects.get((plural, namespace, name)))
            if found is None:
                self.status(404, "NotFound", f'{plural} "{name}" not found')
            else:
                self.finish(found)

        def delete(self, group: str, namespace: str, plural: str, name: str) -> None:
            with fake._lock:
                gone = fake.objects.pop((plural, namespace, name), None)
            if gone is None:
                self.status(404, "NotFound", f'{plural} "{name}" not found')
            else:
                self.finish({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    where = r"/apis/(batch/v1|apps/v1)/namespaces/([^/]+)/(jobs|deployments)"
    return [(where, Collection), (where + r"/([^/]+)", Item)]
