"""A Kubernetes API server (fake, over real HTTP): :class:`FakeKubeAPI`, and for its
clients :func:`kubeconfig` and :func:`self_signed_cert`.

What it adds for pods across namespaces, RBAC and DRA live beside it in
``tests/fakekube_pods.py``, ``tests/fakekube_rbac.py`` and ``tests/fakekube_dra.py``; its
nodes in :mod:`tests.fakes.kubenodes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests import fakekube_apps, fakekube_kueue, fakekube_pods
from tests.fakes.hub import free_port
from tests.fakes.kubenodes import FAKE_MIG_CONFIGS, _mig_manager_apply


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server does with merge-patch+json)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


class FakeKubeAPI:
    """A Kubernetes API server for nodes, in a thread, over real HTTP (tornado).

    It speaks the API's JSON: ``NodeList``/``Node`` objects, ``Status`` errors (401 without the
    token, 404, 415 for a patch type it does not take), merge and strategic-merge patches of a
    node (``metadata.labels``, ``spec.unschedulable``), ``resourceVersion`` bumped per change,
    label selectors ``k=v``, and events with a field selector.

    A simulated **mig-manager** watches ``nvidia.com/mig.config``: once the label changes, each
    ``mig_manager_step()`` moves the node one step, as mig-manager does — the state becomes
    ``pending``; then the config is applied (``success``, the device plugin's and
    gpu-feature-discovery's MIG resources and labels rewritten), or, for a config in
    ``failing``, ``failed`` with a Warning event carrying its message. With ``auto_steps``,
    every read of the node takes one step (for a service in another process).

    For a spawner it also serves what KubeSpawner 7 calls (:func:`_workload_routes`): pods,
    PersistentVolumeClaims, Services, Secrets and Events in namespaces — create (409
    ``AlreadyExists``), read, delete (404 ``NotFound``), list with label and field selectors,
    (a created pod is checked against Kubernetes' schema first: 422 ``Invalid``, as the API
    server answers), and **watch** (``?watch=true``: newline-delimited ``WatchEvent`` JSON from a
    ``resourceVersion``, ended after ``timeoutSeconds``), as the pod reflector uses them. A
    simulated **scheduler and kubelet** run a created pod at once on a node whose labels match
    its ``nodeSelector`` and whose allocatable has its ``nvidia.com/*`` limits (``Running``,
    a pod IP, ready containers, a ``Scheduled`` event); otherwise it stays ``Pending`` with a
    ``FailedScheduling`` event, as on a real cluster. ``calls`` records every authorized
    request and ``unauthorized`` counts refused ones; ``tls=(certfile, keyfile)`` serves HTTPS.

    ``authorizer`` (``tests.fakekube_rbac.RBAC``) replaces the one token: each request is
    authenticated by its token and authorized by RBAC rules (a rendered chart's), answered 401 or
    403 with the API server's Status as a real one does.
    ``dra=tests.fakekube_dra.FakeDRA(slices)`` adds ``resource.k8s.io/v1`` (DeviceClasses,
    ResourceSlices, ResourceClaims) and allocates a pod's claims as it is scheduled. Kueue's
    AdmissionChecks and Workloads (``kueue.x-k8s.io/v1beta2``) are served from ``objects``
    (``tests/fakekube_kueue.py``, with a simulated Kueue), and ``batch/v1`` Jobs and ``apps/v1``
    Deployments (``tests/fakekube_apps.py``, validated with kubernetes-validate on create).
    """

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        *,
        token: str = "kube-token",
        configs: dict[str, dict[str, int]] = FAKE_MIG_CONFIGS,
        auto_steps: bool = False,
        tls: tuple[Path | str, Path | str] | None = None,
        authorizer: Any = None,
        dra: Any = None,
    ) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.authorizer = authorizer
        self.token = token
        self.configs = configs
        self.auto_steps = auto_steps
        self.failing: dict[str, str] = {}  # config → the error mig-manager reports
        self.events: list[dict[str, Any]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (node, content type, body)
        self._pending: dict[str, str] = {}  # node → config mig-manager works on
        self._lock = threading.Lock()
        self.port = free_port()
        self._loop: Any = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.tls = tls
        #: pods, PVCs, services, secrets and events by (plural, namespace, name)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: every authorized request of the workload routes: (method, path)
        self.calls: list[tuple[str, str]] = []
        #: requests refused for a missing or wrong bearer token
        self.unauthorized = 0
        self._rv = 1000  # the last resourceVersion handed out
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, plural, type, obj
        self._waiters: list[asyncio.Future[None]] = []  # watches waiting for a change
        self._closing = False
        #: Dynamic Resource Allocation (``tests.fakekube_dra.FakeDRA``; None: not served)
        self.dra = dra
        if dra is not None:
            dra.install(self)

    @property
    def url(self) -> str:
        """The API server's address."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeKubeAPI:
        ready = threading.Event()
        self._ready = ready
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the fake Kubernetes API did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.add_callback(self._end_watches)
            self._loop.add_callback(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        import tornado.ioloop
        import tornado.web

        fake = self

        class Base(tornado.web.RequestHandler):
            def prepare(self) -> None:
                auth = self.request.headers.get("Authorization", "")
                if fake.authorizer is not None:
                    query = {k: self.get_argument(k) for k in self.request.arguments}
                    refused = fake.authorizer.check(
                        self.request.method, self.request.path, query, auth
                    )
                    if refused is not None:
                        self.status(*refused)
                elif auth != f"Bearer {fake.token}":
                    self.status(401, "Unauthorized", "Unauthorized")

            def status(
                self, code: int, reason: str, message: str, details: dict | None = None
            ) -> None:
                self.set_status(code)
                self.set_header("Content-Type", "application/json")
                self.finish(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        **({"details": details} if details else {}),
                        "code": code,
                    }
                )

            def node_or_404(self, name: str) -> dict[str, Any] | None:
                node = fake.nodes.get(name)
                if node is None:
                    self.status(404, "NotFound", f'nodes "{name}" not found')
                return node

        class Nodes(Base):
            def get(self) -> None:
                selector = self.get_argument("labelSelector", "")
                want = dict(p.split("=", 1) for p in selector.split(",") if "=" in p)
                with fake._lock:
                    items = [
                        copy.deepcopy(n)
                        for n in fake.nodes.values()
                        if all(n["metadata"]["labels"].get(k) == v for k, v in want.items())
                    ]
                self.finish(
                    {
                        "kind": "NodeList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": "100"},
                        "items": items,
                    }
                )

        class OneNode(Base):
            def get(self, name: str) -> None:
                with fake._lock:
                    node = self.node_or_404(name)
                    if node is None:
                        return
                    if fake.auto_steps:
                        fake._step(name)
                    self.finish(copy.deepcopy(node))

            def patch(self, name: str) -> None:
                kind = self.request.headers.get("Content-Type", "").split(";")[0]
                if kind not in (
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                ):
                    self.status(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in "
                        "an unknown format - accepted media types include: "
                        "application/merge-patch+json, "
                        "application/strategic-merge-patch+json",
                    )
                    return
                body = json.loads(self.request.body)
                with fake._lock:
                    node = self.node_or_404(name)
                    if node is None:
                        return
                    before = node["metadata"]["labels"].get("nvidia.com/mig.config")
                    patched = _merge_patch(node, body)
                    rv = int(node["metadata"]["resourceVersion"]) + 1
                    patched["metadata"]["resourceVersion"] = str(rv)
                    fake.nodes[name] = patched
                    fake.patches.append((name, kind, body))
                    after = patched["metadata"]["labels"].get("nvidia.com/mig.config")
                    if after != before and after is not None:
                        fake._pending[name] = after
                    self.finish(copy.deepcopy(patched))

        class Events(Base):
            def get(self) -> None:
                selector = self.get_argument("fieldSelector", "")
                want = dict(p.split("=", 1) for p in selector.split(",") if "=" in p)
                with fake._lock:
                    items = [
                        e
                        for e in fake.events
                        if all(
                            e["involvedObject"].get(k.split(".", 1)[1]) == v
                            for k, v in want.items()
                        )
                    ]
                self.finish({"kind": "EventList", "apiVersion": "v1", "items": items})

        app = tornado.web.Application(
            [
                (r"/api/v1/nodes", Nodes),
                (r"/api/v1/nodes/([^/]+)", OneNode),
                (r"/api/v1/events", Events),
                *_workload_routes(fake, Base),
                *(fake.dra.routes(fake, Base) if fake.dra is not None else ()),
                fakekube_pods.cluster_pods_route(fake, Base),
                *fakekube_kueue.routes(fake, Base),
                *fakekube_apps.routes(fake, Base),
            ]
        )
        asyncio.set_event_loop(asyncio.new_event_loop())
        app.listen(self.port, "127.0.0.1", ssl_options=self._ssl_context())
        self._loop = tornado.ioloop.IOLoop.current()
        self._ready.set()
        self._loop.start()

    def _step(self, name: str) -> str | None:
        """One step of mig-manager on ``name`` (lock held); the state it left."""
        config = self._pending.get(name)
        if config is None:
            return None
        node = self.nodes[name]
        labels = node["metadata"]["labels"]
        if labels.get("nvidia.com/mig.config.state") != "pending":
            labels["nvidia.com/mig.config.state"] = "pending"
            return "pending"
        del self._pending[name]
        if config in self.failing or config not in self.configs:
            labels["nvidia.com/mig.config.state"] = "failed"
            message = self.failing.get(config) or f"config {config!r} not found in the config file"
            self.events.append(
                {
                    "kind": "Event",
                    "apiVersion": "v1",
                    "metadata": {"name": f"{name}.mig{len(self.events)}", "namespace": "default"},
                    "involvedObject": {
                        "kind": "Node",
                        "name": name,
                        "uid": node["metadata"]["uid"],
                    },
                    "reason": "MigConfigFailed",
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "nvidia-mig-manager"},
                    "lastTimestamp": f"2026-03-02T09:00:{len(self.events):02d}Z",
                }
            )
            return "failed"
        _mig_manager_apply(node, config, self.configs)
        labels["nvidia.com/mig.config.state"] = "success"
        return "success"

    def mig_manager_step(self, name: str) -> str | None:
        """Move mig-manager on ``name`` one step; the state it left (None: nothing to do)."""
        with self._lock:
            return self._step(name)

    def node(self, name: str) -> dict[str, Any]:
        """A copy of the node as the server has it now."""
        with self._lock:
            return copy.deepcopy(self.nodes[name])

    # -- workloads (what KubeSpawner creates, reads, lists, watches and deletes) -------------

    def _ssl_context(self) -> Any:
        """The server's TLS context (None: plain HTTP)."""
        if not self.tls:
            return None
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
        return context

    def _record(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        """A change (lock held): a new resourceVersion, kept for watches, watches woken."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, plural, kind, copy.deepcopy(obj)))
        if self._loop is not None:
            self._loop.add_callback(self._notify)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _end_watches(self) -> None:
        self._closing = True
        self._notify()

    def _pod_event(self, pod: dict[str, Any], reason: str, message: str, kind: str) -> None:
        """An Event about ``pod`` (lock held), as the scheduler and kubelet post them."""
        meta = pod["metadata"]
        n = sum(1 for key in self.objects if key[0] == "events")
        event = {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {
                "name": f"{meta['name']}.{n:016x}",
                "namespace": meta["namespace"],
                "uid": str(uuid.uuid4()),
                "creationTimestamp": "2026-03-02T09:00:00Z",
            },
            "involvedObject": {
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "default-scheduler"},
            "firstTimestamp": f"2026-03-02T09:00:{n % 60:02d}Z",
            "lastTimestamp": f"2026-03-02T09:00:{n % 60:02d}Z",
            "count": 1,
        }
        self.objects[("events", meta["namespace"], event["metadata"]["name"])] = event
        self._record("events", "ADDED", event)

    def _schedule(self, pod: dict[str, Any]) -> None:
        """The scheduler and kubelet (lock held): run ``pod`` on a node that fits, else leave
        it Pending with the scheduler's reason."""
        spec = pod["spec"]
        selector = spec.get("nodeSelector") or {}
        claims_why = None
        for node in self.nodes.values():
            labels = node["metadata"]["labels"]
            # what the node's running pods hold is not free (tests/fakekube_pods.py)
            if all(labels.get(k) == v for k, v in selector.items()) and fakekube_pods.fits(
                self, node, pod
            ):
                if self.dra is None or not spec.get("resourceClaims"):
                    break
                claims_why = self.dra.schedule(self, pod, node["metadata"]["name"])
                if claims_why is None:
                    break
        else:
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            ]
            why = (
                "node(s) didn't match Pod's node affinity/selector"
                if selector
                and not any(
                    all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())
                    for n in self.nodes.values()
                )
                else "Insufficient "
                + ", ".join(sorted(fakekube_pods.gpu_requests(pod)) or ["resources"])
            )
            why = claims_why or why
            self._pod_event(
                pod,
                "FailedScheduling",
                f"0/{len(self.nodes)} nodes are available: {why}.",
                "Warning",
            )
            self._record("pods", "MODIFIED", pod)
            return
        name = node["metadata"]["name"]
        spec["nodeName"] = name
        self._pod_event(
            pod,
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/"
            f"{pod['metadata']['name']} to {name}",
            "Normal",
        )
        running = {"running": {"startedAt": "2026-03-02T09:00:05Z"}}
        pod["status"] = {
            "phase": "Running",
            "hostIP": "10.0.0.10",
            "podIP": f"10.244.1.{10 + len(self._history) % 200}",
            "startTime": "2026-03-02T09:00:01Z",
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-03-02T09:00:05Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": running,
                }
                for c in spec.get("containers", [])
            ],
        }
        self._record("pods", "MODIFIED", pod)

    def _create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create an object (None: it exists)."""
        meta = body.setdefault("metadata", {})
        key = (plural, namespace, meta.get("name", ""))
        with self._lock:
            if key in self.objects:
                return None
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                creationTimestamp="2026-03-02T09:00:00Z",
            )
            body.setdefault("apiVersion", "v1")
            body.setdefault("kind", _KINDS[plural])
            if plural == "pods":
                body["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            elif plural == "persistentvolumeclaims":
                body.setdefault("spec", {})["volumeName"] = f"pvc-{meta['uid']}"
                body["status"] = {"phase": "Bound"}
            elif plural == "services":
                body.setdefault("spec", {}).setdefault("clusterIP", "10.96.0.20")
            self.objects[key] = body
            self._record(plural, "ADDED", body)
            if plural == "pods":
                self._schedule(body)
            return copy.deepcopy(body)

    def _delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.pop((plural, namespace, name), None)
            if obj is None:
                return None
            obj["metadata"]["deletionTimestamp"] = "2026-03-02T10:00:00Z"
            self._record(plural, "DELETED", obj)
            if plural == "pods":
                if self.dra is not None:
                    self.dra.pod_gone(self, obj)
                fakekube_pods.retry_pending(self)  # what it held is free again
            # the garbage collector: what the object owned goes with it
            uid = obj["metadata"]["uid"]
            for key, other in list(self.objects.items()):
                owners = other["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == uid for o in owners):
                    del self.objects[key]
                    self._record(key[0], "DELETED", other)
            return copy.deepcopy(obj)

    def _matching(self, plural: str, namespace: str, labels: str, fields: str) -> Callable:
        want = dict(p.split("=", 1) for p in labels.split(",") if "=" in p)
        by_field = dict(p.split("=", 1) for p in fields.split(",") if "=" in p)

        def field_of(obj: dict[str, Any], path: str) -> Any:
            for part in path.split("."):
                obj = obj.get(part) if isinstance(obj, dict) else None
            return obj

        def match(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return (
                meta.get("namespace") == namespace
                and all((meta.get("labels") or {}).get(k) == v for k, v in want.items())
                and all(str(field_of(obj, k)) == v for k, v in by_field.items())
            )

        return match

    def objects_of(self, plural: str) -> dict[str, dict[str, Any]]:
        """Copies of the live objects of a kind (``pods``, ``persistentvolumeclaims``,
        ``services``, ``events``) by ``namespace/name``."""
        with self._lock:
            return {
                f"{ns}/{name}": copy.deepcopy(obj)
                for (p, ns, name), obj in self.objects.items()
                if p == plural
            }

    def terminate(self, namespace: str, pod: str, exit_code: int = 0) -> None:
        """The pod's containers exit (phase Succeeded or Failed), as the kubelet reports."""
        with self._lock:
            obj = self.objects[("pods", namespace, pod)]
            obj["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for cs in obj["status"].get("containerStatuses", []):
                cs["ready"] = False
                cs["state"] = {"terminated": {"exitCode": exit_code, "reason": "Completed"}}
            self._record("pods", "MODIFIED", obj)
            fakekube_pods.retry_pending(self)


#: The kinds of the namespaced workload routes, by plural.
_KINDS = {
    "pods": "Pod",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "services": "Service",
    "secrets": "Secret",
    "events": "Event",
}


def _workload_routes(fake: FakeKubeAPI, base: type) -> list[tuple[str, type]]:
    """The ``/api/v1/namespaces/{ns}/{plural}[/{name}]`` routes of :class:`FakeKubeAPI`."""
    plurals = "|".join(_KINDS)

    class Workload(base):  # type: ignore[misc, valid-type]
        def prepare(self) -> None:
            super().prepare()
            if self._finished:
                fake.unauthorized += 1
            else:
                fake.calls.append((self.request.method, self.request.path))

        def not_found(self, plural: str, name: str) -> None:
            self.status(404, "NotFound", f'{plural} "{name}" not found')

    class Collection(Workload):
        async def get(self, namespace: str, plural: str) -> None:
            match = fake._matching(
                plural,
                namespace,
                self.get_argument("labelSelector", ""),
                self.get_argument("fieldSelector", ""),
            )
            if self.get_argument("watch", "").lower() in ("true", "1"):
                await self.watch(plural, match)
                return
            with fake._lock:
                items = [
                    copy.deepcopy(o)
                    for (p, _, _), o in fake.objects.items()
                    if p == plural and match(o)
                ]
                rv = fake._rv
            self.finish(
                {
                    "kind": f"{_KINDS[plural]}List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                }
            )

        async def watch(self, plural: str, match: Callable) -> None:
            """WatchEvents after ``resourceVersion`` (all current objects for 0), one JSON
            per line, until ``timeoutSeconds`` pass or the server stops."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + float(self.get_argument("timeoutSeconds", "30"))
            since = self.get_argument("resourceVersion", "0") or "0"
            self.set_header("Content-Type", "application/json")
            with fake._lock:
                if since == "0":
                    lines = [
                        {"type": "ADDED", "object": copy.deepcopy(o)}
                        for (p, _, _), o in fake.objects.items()
                        if p == plural and match(o)
                    ]
                    sent = fake._rv
                else:
                    lines, sent = [], int(since)
            while True:
                with fake._lock:
                    for rv, p, kind, obj in fake._history:
                        if rv > sent and p == plural and match(obj):
                            lines.append({"type": kind, "object": obj})
                    sent = fake._rv
                if lines:
                    self.write("".join(json.dumps(e) + "\n" for e in lines))
                    lines = []
                    await self.flush()
                    continue  # changes made while the chunk went out
                left = deadline - loop.time()
                if fake._closing or left <= 0:
                    break
                waiter = loop.create_future()
                fake._waiters.append(waiter)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter, left)
            self.finish()

        def post(self, namespace: str, plural: str) -> None:
            body = json.loads(self.request.body)
            if plural == "pods":  # the API server's schema check (kubernetes-validate)
                refused = fakekube_pods.problems(body)
                if refused is not None:
                    name = (body.get("metadata") or {}).get("name")
                    self.status(422, "Invalid", f'Pod "{name}" is invalid: {refused}')
                    return
            created = fake._create(plural, namespace, body)
            if created is None:
                name = body["metadata"].get("name")
                self.status(409, "AlreadyExists", f'{plural} "{name}" already exists')
                return
            self.set_status(201)
            self.finish(created)

    class Item(Workload):
        def get(self, namespace: str, plural: str, name: str) -> None:
            with fake._lock:
                found = copy.deepcopy(fake.objects.get((plural, namespace, name)))
            if found is None:
                self.not_found(plural, name)
            else:
                self.finish(found)

        def delete(self, namespace: str, plural: str, name: str) -> None:
            gone = fake._delete(plural, namespace, name)
            if gone is None:
                self.not_found(plural, name)
            else:
                self.finish(gone)

    return [
        (rf"/api/v1/namespaces/([^/]+)/({plurals})", Collection),
        (rf"/api/v1/namespaces/([^/]+)/({plurals})/([^/]+)", Item),
    ]


def self_signed_cert(where: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), for a :class:`FakeKubeAPI` over
    TLS: the certificate is its own CA (``ssl_ca_cert``)."""
    import subprocess

    cert, key = where / "apiserver.crt", where / "apiserver.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def kubeconfig(servers: Mapping[str, FakeKubeAPI], current: str) -> dict[str, Any]:
    """A kube config (as ``kubectl config view --raw`` prints it) with one context per fake
    API server, named as in ``servers``, each with its bearer token."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": s.url,
                    **({"certificate-authority": str(s.tls[0])} if s.tls else {}),
                },
            }
            for name, s in servers.items()
        ],
        "users": [{"name": name, "user": {"token": s.token}} for name, s in servers.items()],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
            for name in servers
        ],
    }
