"""What :class:`tests.fakes.FakeKubeAPI` adds for pods across namespaces, as a real API
server and scheduler behave:

* ``GET /api/v1/pods``: every namespace's pods, with a ``fieldSelector`` of ``=``/``==`` and
  ``!=`` terms (``spec.nodeName=gpu-1``, ``status.phase!=Succeeded``) and a ``labelSelector``;
* the scheduler's resource fit: a node gives a pod only what its ``allocatable`` has left after
  the pods bound to it that still run (not ``Succeeded``/``Failed``), counted per
  ``nvidia.com/*`` resource with Kubernetes' effective request (the larger of the containers'
  sum and the largest init container); a pod that does not fit stays ``Pending``
  (``FailedScheduling``), and is scheduled again when a pod ends or is deleted, as the real
  scheduler retries unschedulable pods;
* the API server's schema check of a created pod (:func:`problems`: kubernetes-validate,
  strict, for the newest Kubernetes it knows): a pod it refuses is a 422 ``Invalid``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

ENDED = ("Succeeded", "Failed")
#: The Kubernetes version created pods must validate for (DRA's resourceClaimName is 1.31+).
VALIDATE_FOR = "1.35"


def problems(pod: dict[str, Any]) -> str | None:
    """What the API server's schema would refuse in a new pod (None: nothing)."""
    try:
        import kubernetes_validate
    except ImportError:  # the test extra's kubernetes-validate is not installed
        return None
    try:
        # the API server takes apiVersion and kind from the URL when a body leaves them out
        whole = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(pod)}
        kubernetes_validate.validate(whole, desired_version=VALIDATE_FOR, strict=True)
    except kubernetes_validate.ValidationError as e:
        return str(e.message)
    return None


def gpu_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """A pod's ``nvidia.com/*`` effective requests (limits; requests equal them if given)."""
    spec = pod.get("spec") or {}

    def of(c: Mapping[str, Any]) -> dict[str, int]:
        res = c.get("resources") or {}
        got = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        return {k: int(v) for k, v in got.items() if k.startswith("nvidia.com/")}

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for k, n in of(c).items():
            total[k] = total.get(k, 0) + n
    for c in spec.get("initContainers") or ():
        for k, n in of(c).items():
            total[k] = max(total.get(k, 0), n)
    return total


def left_on(fake: Any, node: Mapping[str, Any], but: Mapping[str, Any] | None = None) -> dict:
    """``nvidia.com/*`` allocatable of ``node`` less what its running pods hold (lock held)."""
    name = node["metadata"]["name"]
    left = {
        k: int(v)
        for k, v in (node["status"].get("allocatable") or {}).items()
        if k.startswith("nvidia.com/")
    }
    for (plural, _, _), pod in fake.objects.items():
        if plural != "pods" or pod is but or pod["spec"].get("nodeName") != name:
            continue
        if pod["status"].get("phase") in ENDED:
            continue
        for k, n in gpu_requests(pod).items():
            left[k] = left.get(k, 0) - n
    return left


def fits(fake: Any, node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``node`` has the pod's GPUs left (lock held)."""
    left = left_on(fake, node, but=pod)
    return all(left.get(k, 0) >= n for k, n in gpu_requests(pod).items())


def retry_pending(fake: Any) -> None:
    """Schedule again every pod left Pending without a node (lock held)."""
    for (plural, _, _), pod in list(fake.objects.items()):
        unbound = plural == "pods" and not pod["spec"].get("nodeName")
        if unbound and pod["status"].get("phase") == "Pending":
            fake._schedule(pod)


def _selector(text: str) -> list[tuple[str, str, bool]]:
    """``k=v``, ``k==v`` and ``k!=v`` terms: (key, value, equal)."""
    out = []
    for term in filter(None, text.split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k, v, False))
        else:
            k, v = term.replace("==", "=").split("=", 1)
            out.append((k, v, True))
    return out


def _field(obj: Any, path: str) -> str:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def cluster_pods_route(fake: Any, base: type) -> tuple[str, type]:
    """``GET /api/v1/pods`` of :class:`FakeKubeAPI`."""

    class AllPods(base):  # type: ignore[misc, valid-type]
        def prepare(self) -> None:
            super().prepare()
            if self._finished:
                fake.unauthorized += 1
            else:
                fake.calls.append((self.request.method, self.request.path))

        def get(self) -> None:
            fields = _selector(self.get_argument("fieldSelector", ""))
            labels = _selector(self.get_argument("labelSelector", ""))

            def match(o: dict[str, Any]) -> bool:
                have = o["metadata"].get("labels") or {}
                return all((_field(o, k) == v) == eq for k, v, eq in fields) and all(
                    ((have.get(k) or "") == v) == eq for k, v, eq in labels
                )

            with fake._lock:
                items = [
                    copy.deepcopy(o)
                    for (p, _, _), o in fake.objects.items()
                    if p == "pods" and match(o)
                ]
                rv = fake._rv
            self.finish(
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                }
            )

    return (r"/api/v1/pods", AllPods)
