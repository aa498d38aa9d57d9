"""The pool's interface to a Kubernetes API server: read nodes, pods and DRA objects, patch
node labels.

Plain HTTP with ``httpx`` (no client library to keep in step with the server): the calls are
few — ``GET /api/v1/nodes``, ``GET /api/v1/nodes/{name}``, a JSON merge patch of a node's
labels, the node's events, the pods of every namespace (``GET /api/v1/pods``) and, with
Dynamic Resource Allocation, the ResourceSlices and every namespace's ResourceClaims
(``resource.k8s.io/v1``) — and the bodies are Kubernetes' own JSON. In a pod, the service
account's token, CA and the ``KUBERNETES_SERVICE_*`` address are used; elsewhere a host, CA
and token are given (``KubeAPI``). The token file is read on every request, as
service-account tokens rotate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

#: Dynamic Resource Allocation's API (GA in Kubernetes 1.34).
RESOURCE_API = "/apis/resource.k8s.io/v1"
#: Kueue's API (AdmissionChecks, Workloads).
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(Exception):
    """The API server refused or could not be reached (``status`` None: not reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeAPI:
    """Where the API server is and how to authenticate."""

    host: str
    token_file: str = ""
    token: str = ""
    ca_file: str = ""
    verify: bool = True

    @classmethod
    def in_cluster(cls) -> KubeAPI:
        """The API server of the pod this runs in (its service account)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeError("not in a Kubernetes pod: set the API host (MigLabeller.api_host)")
        return cls(
            f"https://{host}:{port}",
            token_file=str(SERVICE_ACCOUNT / "token"),
            ca_file=str(SERVICE_ACCOUNT / "ca.crt"),
        )


class KubeClient:
    """The few node calls the pool makes (async)."""

    def __init__(self, api: KubeAPI, timeout: float = 10.0) -> None:
        self.api = api
        verify: Any = api.verify
        if api.verify and api.ca_file:
            verify = api.ca_file
        self._http = httpx.AsyncClient(
            base_url=api.host.rstrip("/"), verify=verify, timeout=timeout
        )

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        token = self.api.token
        if self.api.token_file:
            token = Path(self.api.token_file).read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = {**self._headers(), "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            r = await self._http.request(method, path, params=params, json=json, headers=headers)
        except httpx.HTTPError as e:
            raise KubeError(f"{method} {path}: {type(e).__name__}: {e}") from None
        if r.status_code >= 400:
            try:
                message = r.json().get("message") or r.text
            except ValueError:
                message = r.text
            raise KubeError(f"{method} {path}: {r.status_code} {message}", r.status_code)
        body: dict[str, Any] = r.json()
        return body

    async def list_nodes(self, label_selector: str = "") -> list[dict[str, Any]]:
        """Every node (matching ``label_selector``), as Kubernetes ``Node`` objects."""
        params = {"labelSelector": label_selector} if label_selector else None
        return (await self._call("GET", "/api/v1/nodes", params=params)).get("items") or []

    async def list_pods(self, field_selector: str = "") -> list[dict[str, Any]]:
        """Pods of every namespace (matching ``field_selector``, e.g.
        ``spec.nodeName=gpu-1``), as Kubernetes ``Pod`` objects."""
        params = {"fieldSelector": field_selector} if field_selector else None
        return (await self._call("GET", "/api/v1/pods", params=params)).get("items") or []

    async def list_resource_slices(self, driver: str = "") -> list[dict[str, Any]]:
        """The ResourceSlices (of the DRA ``driver``, e.g. ``gpu.nvidia.com``): the devices
        each node's driver publishes."""
        params = {"fieldSelector": f"spec.driver={driver}"} if driver else None
        path = f"{RESOURCE_API}/resourceslices"
        return (await self._call("GET", path, params=params)).get("items") or []

    async def list_resource_claims(self) -> list[dict[str, Any]]:
        """The ResourceClaims of every namespace, with their allocations (``status``)."""
        return (await self._call("GET", f"{RESOURCE_API}/resourceclaims")).get("items") or []

    async def get_node(self, name: str) -> dict[str, Any]:
        """One ``Node``."""
        return await self._call("GET", f"/api/v1/nodes/{name}")

    async def patch_labels(self, name: str, labels: dict[str, str | None]) -> dict[str, Any]:
        """Set (or, with None, remove) labels of a node: a JSON merge patch (RFC 7386)."""
        return await self._call(
            "PATCH",
            f"/api/v1/nodes/{name}",
            json={"metadata": {"labels": labels}},
            content_type="application/merge-patch+json",
        )

    async def list_admission_checks(self) -> list[dict[str, Any]]:
        """Kueue's AdmissionChecks (cluster-scoped; ``spec.controllerName`` names who acts)."""
        return (await self._call("GET", f"{KUEUE_API}/admissionchecks")).get("items") or []

    async def list_workloads(self) -> list[dict[str, Any]]:
        """Kueue's Workloads of every namespace, with their status (conditions, checks)."""
        return (await self._call("GET", f"{KUEUE_API}/workloads")).get("items") or []

    async def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """A JSON merge patch of a Workload's ``status`` subresource, refused (409) if the
        Workload changed since ``resource_version`` was read (a list is replaced whole by a
        merge patch, so the other checks' entries must be the ones just read)."""
        return await self._call(
            "PATCH",
            f"{KUEUE_API}/namespaces/{namespace}/workloads/{name}/status",
            json={"metadata": {"resourceVersion": resource_version}, "status": status},
            content_type="application/merge-patch+json",
        )

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object in the collection at ``path`` (e.g. a namespace's batch Jobs)."""
        return await self._call("POST", path, json=body)

    async def list_at(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        """The objects of the collection at ``path`` (matching ``label_selector``)."""
        params = {"labelSelector": label_selector} if label_selector else None
        return (await self._call("GET", path, params=params)).get("items") or []

    async def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``."""
        return await self._call("GET", path)

    async def delete(self, path: str, grace_seconds: int | None = None) -> dict[str, Any]:
        """Delete the object at ``path``, its pods in the background (they get SIGTERM;
        ``grace_seconds`` replaces their termination grace period, 0: killed at once)."""
        params = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            params["gracePeriodSeconds"] = str(grace_seconds)
        return await self._call("DELETE", path, params=params)

    async def node_events(self, name: str) -> list[dict[str, Any]]:
        """The events about a node (newest last), e.g. why a MIG change failed."""
        params = {"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={name}"}
        items = (await self._call("GET", "/api/v1/events", params=params)).get("items") or []
        return sorted(items, key=lambda e: e.get("lastTimestamp") or "")
