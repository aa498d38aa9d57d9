"""Dynamic Resource Allocation for :class:`tests.fakes.FakeKubeAPI`: ``resource.k8s.io/v1``.

``FakeKubeAPI(..., dra=FakeDRA(slices))`` serves, over the same real HTTP:

- discovery ``/apis/resource.k8s.io/v1`` (404 without DRA, as an older cluster answers);
- DeviceClasses (the NVIDIA driver's ``gpu.nvidia.com`` and ``mig.nvidia.com`` with their CEL
  selectors by default) and ResourceSlices (list with ``spec.driver`` / ``spec.nodeName``
  field selectors, get);
- ResourceClaims in namespaces: create (409 ``AlreadyExists``; 422 ``Invalid`` for a claim the
  Kubernetes 1.34 schema refuses or whose CEL this evaluator cannot compile), get, list, delete
  (404 ``NotFound``; a claim still reserved by a pod keeps a ``deletionTimestamp`` until the pod
  goes, as the API server's finalizer does).

And it plays the **scheduler's allocator**: when a pod referencing claims is scheduled, each
unallocated claim's requests are matched against the node's published devices — the
DeviceClass's selectors and the request's, in a small CEL evaluator (:func:`cel_eval`) for the
forms the driver and the spawner write — skipping devices any other claim holds. The first fit
is written to ``status.allocation.devices.results`` (with the node in ``nodeSelector``) and the
pod to ``status.reservedFor``; nothing fits → the pod stays ``Pending`` with a
``FailedScheduling`` event saying why. When the last pod of a claim goes, the claim is
deallocated (the resourceclaim controller's job).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"

#: The NVIDIA DRA driver's DeviceClasses (deployments/helm/.../deviceclass-{gpu,mig}.yaml).
NVIDIA_CLASSES = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].type == 'mig'",
}


# -- what the NVIDIA driver publishes ---------------------------------------------------------


def _attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: (
            {"bool": v}
            if isinstance(v, bool)
            else {"int": v}
            if isinstance(v, int)
            else {"string": v}
        )
        for k, v in values.items()
    }


def nvidia_slice(node: str, gpus: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ResourceSlice the NVIDIA driver's kubelet plugin publishes for ``node``.

    ``gpus``: ``{uuid, product, memory_gib, mig: [{profile, start, size, uuid, memory_gib}]}``
    per GPU (minor = position). A GPU without ``mig`` is ``gpu-<minor>`` (``type: gpu``,
    ``uuid``, capacity ``memory``); with ``mig``, each instance is
    ``gpu-<minor>-mig-<profile>-<start>`` (``type: mig``, ``uuid``, ``parentUUID``,
    ``profile``, a ``memorySlice<i>`` capacity per slice it covers), as ``deviceinfo.go`` and
    ``mig.go`` write them.
    """
    devices = []
    for minor, gpu in enumerate(gpus):
        common = {"productName": gpu.get("product", "NVIDIA H100 80GB HBM3"), "brand": "Nvidia"}
        if not gpu.get("mig"):
            devices.append(
                {
                    "name": f"gpu-{minor}",
                    "attributes": _attrs({"type": "gpu", "uuid": gpu["uuid"], **common}),
                    "capacity": {"memory": {"value": f"{gpu.get('memory_gib', 80)}Gi"}},
                }
            )
            continue
        for inst in gpu["mig"]:
            profile = inst["profile"]
            caps = {"memory": {"value": f"{inst.get('memory_gib', 10)}Gi"}}
            for i in range(inst["start"], inst["start"] + inst.get("size", 1)):
                caps[f"memorySlice{i}"] = {"value": "1"}
            name = re.sub(r"[^a-z0-9-]", "", profile.replace(".", "").replace("+", "-"))
            devices.append(
                {
                    "name": f"gpu-{minor}-mig-{name}-{inst['start']}",
                    "attributes": _attrs(
                        {
                            "type": "mig",
                            "uuid": inst["uuid"],
                            "parentUUID": gpu["uuid"],
                            "profile": profile,
                            **common,
                        }
                    ),
                    "capacity": caps,
                }
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-{uuid.uuid4().hex[:5]}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def nvidia_partitioned_slices(node: str, gpus: Iterable[Mapping[str, Any]]) -> list[dict]:
    """What the NVIDIA driver publishes for ``node``'s MIG-mode GPUs with its ``DynamicMIG``
    feature gate (``cmd/gpu-kubelet-plugin/partitions.go``, Kubernetes KEP-4815): one counter
    set per GPU, ``gpu-<minor>-counter-set``, with a ``multiprocessors`` counter and one
    ``memory-slice-<i>`` counter (value 1) per memory slice; the full GPU ``gpu-<minor>``
    consuming all of them; and for every profile and legal placement start an abstract MIG
    device ``gpu-<minor>-mig-<profile>-<id>-<start>`` (``type: mig``, ``parentUUID``,
    ``profile``; no ``uuid``, no ``memorySlice`` capacity) consuming its multiprocessors and
    the memory slices of its placement. The counters are a slice of their own (Kubernetes
    1.35 keeps ``sharedCounters`` and ``devices`` in separate slices of one pool).

    ``gpus``: ``{uuid, model}`` per GPU (minor = position; ``model`` a catalog name, whose MIG
    profiles and placements are the pool's own table of NVIDIA's). Multiprocessors are
    illustrative: 14 per compute slice.
    """
    from jupyterhub_gpupool.pool.catalog import default_catalog

    catalog = default_catalog()
    counter_sets, devices = [], []
    for minor, gpu in enumerate(gpus):
        model = catalog.model(gpu["model"])
        counter_set = f"gpu-{minor}-counter-set"
        every = {"multiprocessors": {"value": str(14 * model.compute_slices)}}
        every.update({f"memory-slice-{i}": {"value": "1"} for i in range(model.memory_slices)})
        counter_sets.append({"name": counter_set, "counters": every})
        common = {"productName": gpu.get("product", model.name), "brand": "Nvidia"}
        devices.append(
            {
                "name": f"gpu-{minor}",
                "attributes": _attrs({"type": "gpu", "uuid": gpu["uuid"], **common}),
                "capacity": {"memory": {"value": f"{int(model.memory_gb)}Gi"}},
                "consumesCounters": [{"counterSet": counter_set, "counters": copy.deepcopy(every)}],
            }
        )
        for name, profile in model.profiles.items():
            if profile.id is None or not profile.compute_slices:
                continue
            sms = {"multiprocessors": {"value": str(14 * profile.compute_slices)}}
            pname = re.sub(r"[^a-z0-9-]", "", name.replace(".", "").replace("+", "-"))
            for start in profile.starts:
                uses = dict(sms)
                for i in range(start, start + profile.memory_slices):
                    uses[f"memory-slice-{i}"] = {"value": "1"}
                devices.append(
                    {
                        "name": f"gpu-{minor}-mig-{pname}-{profile.id}-{start}",
                        "attributes": _attrs(
                            {"type": "mig", "parentUUID": gpu["uuid"], "profile": name, **common}
                        ),
                        "capacity": {
                            "multiprocessors": {"value": str(14 * profile.compute_slices)},
                            "memory": {"value": f"{int((profile.memory_gb or 1) * 1024)}Mi"},
                        },
                        "consumesCounters": [{"counterSet": counter_set, "counters": uses}],
                    }
                )
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-counters"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": dict(pool),
                "sharedCounters": counter_sets,
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-devices"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": dict(pool), "devices": devices},
        },
    ]


# -- a CEL evaluator for the forms in use -------------------------------------------------------


class CelError(Exception):
    """An expression this evaluator cannot compile, or an evaluation error (missing key)."""


_TOKEN = re.compile(
    r"\s*(?:(?P<str>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')|(?P<int>\d+)|"
    r"(?P<op>&&|\|\||==|!=|!|\(|\)|\[|\]|\.)|(?P<id>[A-Za-z_][A-Za-z0-9_]*))"
)


def _tokens(text: str) -> list[tuple[str, Any]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CelError(f"unexpected {text[pos : pos + 10]!r}")
        pos = m.end()
        if m.group("str") is not None:
            out.append(("lit", m.group("str")[1:-1].encode().decode("unicode_escape")))
        elif m.group("int") is not None:
            out.append(("lit", int(m.group("int"))))
        elif m.group("op") is not None:
            out.append(("op", m.group("op")))
        else:
            word = m.group("id")
            if word in ("true", "false"):
                out.append(("lit", word == "true"))
            elif word == "in":
                out.append(("op", "in"))
            else:
                out.append(("id", word))
    return out


class _Parser:
    """Recursive descent over ``||``, ``&&``, ``!``, ``==``/``!=``/``in``, member and index
    access, literals and ``device``: an AST of tuples, evaluated by :func:`_eval`."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, op: str | None = None) -> tuple[str, Any]:
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise CelError(f"expected {op or 'more'} at token {self.i}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        node = self.or_()
        if self.peek() is not None:
            raise CelError(f"unexpected {self.peek()[1]!r}")
        return node

    def or_(self) -> Any:
        node = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self) -> Any:
        node = self.unary()
        while self.peek() == ("op", "&&"):
            self.take()
            node = ("and", node, self.unary())
        return node

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return ("not", self.unary())
        left = self.term()
        tok = self.peek()
        if tok in (("op", "=="), ("op", "!="), ("op", "in")):
            self.take()
            return (tok[1], left, self.term())
        return left

    def term(self) -> Any:
        tok = self.take()
        if tok == ("op", "("):
            node = self.or_()
            self.take(")")
        elif tok[0] == "lit":
            node = ("lit", tok[1])
        elif tok == ("id", "device"):
            node = ("device",)
        else:
            raise CelError(f"undeclared reference {tok[1]!r}")
        while self.peek() in (("op", "."), ("op", "[")):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "id":
                    raise CelError("a field name must follow '.'")
                node = ("get", node, ("lit", name))
            else:
                node = ("get", node, self.or_())
                self.take("]")
        return node


def cel_compile(expression: str) -> Any:
    """The AST of ``expression`` (``CelError`` for what this evaluator does not know)."""
    return _Parser(expression).parse()


def _eval(node: Any, device: Mapping[str, Any]) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "device":
        return device
    if op == "get":
        obj, key = _eval(node[1], device), _eval(node[2], device)
        if not isinstance(obj, Mapping) or key not in obj:
            raise CelError(f"no such key: {key}")
        return obj[key]
    if op == "not":
        return not _eval(node[1], device)
    if op in ("and", "or"):
        # CEL's logical operators are commutative over errors: false && error is false
        results = []
        for side in node[1:]:
            try:
                results.append(bool(_eval(side, device)))
            except CelError as e:
                results.append(e)
        decisive = op == "or"
        if decisive in results:
            return decisive
        for r in results:
            if isinstance(r, CelError):
                raise r
        return not decisive
    left, right = _eval(node[1], device), _eval(node[2], device)
    if op == "in":
        if not isinstance(right, Mapping | list):
            raise CelError("'in' needs a map or a list")
        return left in right
    return (left == right) if op == "==" else (left != right)


def cel_eval(expression: str | Any, device: Mapping[str, Any]) -> bool:
    """Evaluate a selector against ``device`` (the CEL view: ``driver``, ``attributes`` and
    ``capacity`` by domain). A non-boolean result is an error, as in Kubernetes."""
    tree = cel_compile(expression) if isinstance(expression, str) else expression
    out = _eval(tree, device)
    if not isinstance(out, bool):
        raise CelError(f"the expression gave {out!r}, not a bool")
    return out


def cel_view(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """A slice device as CEL sees it: unqualified names are in the driver's domain."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, short = name.rpartition("/")
        plain = next(iter(value.values())) if value else None
        attributes.setdefault(domain or driver, {})[short] = plain
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[short] = (value or {}).get("value")
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


# -- the server side ------------------------------------------------------------------------------


class FakeDRA:
    """The DRA state and routes of one :class:`tests.fakes.FakeKubeAPI` (its lock held by
    every method that touches ``fake.objects``)."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]] = (),
        *,
        classes: Mapping[str, str] | None = None,
        validate_version: str | None = "1.34",
    ) -> None:
        self.initial_slices = [copy.deepcopy(dict(s)) for s in slices]
        self.classes = dict(NVIDIA_CLASSES if classes is None else classes)
        self.validate_version = validate_version

    def install(self, fake: Any) -> None:
        """Put the slices and classes among the fake's objects (at construction)."""
        for s in self.initial_slices:
            s["metadata"].setdefault("uid", str(uuid.uuid4()))
            s["metadata"].setdefault("resourceVersion", "1")
            fake.objects[("resourceslices", "", s["metadata"]["name"])] = s
        for name, expression in self.classes.items():
            fake.objects[("deviceclasses", "", name)] = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "1"},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            }

    # -- validation of created claims ----------------------------------------------------------

    def problems(self, claim: Mapping[str, Any]) -> list[str]:
        """What the API server would refuse in a new claim (schema, request shape, CEL)."""
        out = []
        if self.validate_version:
            import kubernetes_validate

            try:
                kubernetes_validate.validate(
                    dict(claim), desired_version=self.validate_version, strict=True
                )
            except kubernetes_validate.ValidationError as e:
                return [f"schema: {e.message}"]
        if not isinstance(claim.get("spec"), Mapping) or not isinstance(
            claim["spec"].get("devices"), Mapping
        ):
            return ["spec.devices: Required value"]
        for i, req in enumerate(
            ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ()
        ):
            where = f"spec.devices.requests[{i}]"
            subs = [req["exactly"]] if req.get("exactly") else list(req.get("firstAvailable") or ())
            if not subs:
                out.append(f"{where}: exactly or firstAvailable is required")
            for sub in subs:
                if sub.get("allocationMode", "ExactCount") != "ExactCount":
                    out.append(f"{where}: this fake allocates ExactCount only")
                for j, sel in enumerate(sub.get("selectors") or ()):
                    try:
                        cel_compile(sel["cel"]["expression"])
                    except (CelError, KeyError) as e:
                        out.append(
                            f"{where}.selectors[{j}].cel.expression: compilation failed: {e}"
                        )
        return out

    # -- allocation ---------------------------------------------------------------------------

    def _taken(self, fake: Any, but: Any) -> set[tuple[str, str, str]]:
        held = set()
        for (plural, _, _), obj in fake.objects.items():
            if plural != "resourceclaims" or obj is but:
                continue
            for r in (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or ():
                held.add((r["driver"], r["pool"], r["device"]))
        return held

    def _devices(
        self, fake: Any, node: str
    ) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
        out = []
        for (plural, _, _), s in sorted(fake.objects.items(), key=lambda kv: kv[0]):
            spec = s.get("spec") or {}
            if plural != "resourceslices" or spec.get("nodeName") != node:
                continue
            for d in spec.get("devices") or ():
                out.append((spec["driver"], spec["pool"]["name"], d, cel_view(spec["driver"], d)))
        return out

    def _counters(self, fake: Any, node: str) -> dict[tuple[str, str, str], dict[str, int]]:
        """The node's shared counters: (driver, pool, counter set) → counter → its value."""
        out = {}
        for (plural, _, _), s in fake.objects.items():
            spec = s.get("spec") or {}
            if plural != "resourceslices" or spec.get("nodeName") != node:
                continue
            for counter_set in spec.get("sharedCounters") or ():
                out[(spec["driver"], spec["pool"]["name"], counter_set["name"])] = {
                    k: int(v["value"]) for k, v in counter_set["counters"].items()
                }
        return out

    def _counters_left(
        self,
        sets: dict[tuple[str, str, str], dict[str, int]],
        by_key: Mapping[tuple[str, str, str], Mapping[str, Any]],
        taken: Iterable[tuple[str, str, str]],
        key: tuple[str, str, str],
    ) -> bool:
        """Whether the device ``key`` may be allocated beside the ``taken`` ones: every counter
        it consumes has that much left in its counter set (KEP-4815's rule: a partitionable
        device is allocatable only while its counters remain)."""
        used: dict[tuple[str, str, str, str], int] = {}
        for other in taken:
            dev = by_key.get(other)
            for use in (dev or {}).get("consumesCounters") or ():
                for name, value in use["counters"].items():
                    k = (other[0], other[1], use["counterSet"], name)
                    used[k] = used.get(k, 0) + int(value["value"])
        for use in by_key[key].get("consumesCounters") or ():
            available = sets.get((key[0], key[1], use["counterSet"]))
            if available is None:
                return False  # a counter set nobody published: never allocatable
            for name, value in use["counters"].items():
                have = available.get(name, 0) - used.get(
                    (key[0], key[1], use["counterSet"], name), 0
                )
                if int(value["value"]) > have:
                    return False
        return True

    def _match(self, fake: Any, sub: Mapping[str, Any], view: Mapping[str, Any]) -> bool:
        device_class = fake.objects.get(("deviceclasses", "", sub.get("deviceClassName", "")))
        if device_class is None:
            raise CelError(f"device class {sub.get('deviceClassName')} not found")
        selectors = [*(device_class["spec"].get("selectors") or ()), *(sub.get("selectors") or ())]
        return all(cel_eval(s["cel"]["expression"], view) for s in selectors)

    def _allocate_claim(self, fake: Any, claim: dict[str, Any], node: str) -> str | None:
        """Allocate ``claim`` on ``node`` (committed only when every request fits); the reason
        when it cannot be."""
        taken = self._taken(fake, claim)
        devices = self._devices(fake, node)
        sets = self._counters(fake, node)
        by_key = {(driver, pool, dev["name"]): dev for driver, pool, dev, _ in devices}
        results = []
        for req in claim["spec"]["devices"]["requests"]:
            subs = (
                [(req["name"], req["exactly"])]
                if req.get("exactly")
                else [(f"{req['name']}/{s['name']}", s) for s in req.get("firstAvailable") or ()]
            )
            found = None
            for request_name, sub in subs:
                need = int(sub.get("count", 1))
                picked = []
                for driver, pool, dev, view in devices:
                    key = (driver, pool, dev["name"])
                    if key in taken or key in picked:
                        continue
                    if dev.get("consumesCounters") and not self._counters_left(
                        sets, by_key, [*taken, *picked], key
                    ):
                        continue
                    try:
                        ok = self._match(fake, sub, view)
                    except CelError as e:
                        return f"claim {claim['metadata']['name']}: {e}"
                    if ok:
                        picked.append(key)
                        if len(picked) == need:
                            break
                if len(picked) == need:
                    found = (request_name, picked)
                    break
            if found is None:
                held = self._holders(fake, claim, node, req)
                return (
                    f"cannot allocate all claims: request {req['name']} of claim "
                    f"{claim['metadata']['name']} matches no free device on {node}{held}"
                )
            for key in found[1]:
                taken.add(key)
                results.append(
                    {"request": found[0], "driver": key[0], "pool": key[1], "device": key[2]}
                )
        config = [
            {"source": "FromClaim", **c} for c in claim["spec"]["devices"].get("config") or ()
        ]
        claim["status"] = {
            "allocation": {
                "devices": {"results": results, **({"config": config} if config else {})},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [],
        }
        return None

    def _holders(
        self, fake: Any, claim: Mapping[str, Any], node: str, req: Mapping[str, Any]
    ) -> str:
        """`` (held by claim ns/name)`` where a matching device is held by another claim."""
        subs = [req["exactly"]] if req.get("exactly") else list(req.get("firstAvailable") or ())
        for (plural, ns, name), other in fake.objects.items():
            if plural != "resourceclaims" or other is claim:
                continue
            for r in (
                ((other.get("status") or {}).get("allocation") or {}).get("devices") or {}
            ).get("results") or ():
                for driver, pool, dev, view in self._devices(fake, node):
                    if (driver, pool, dev["name"]) == (r["driver"], r["pool"], r["device"]):
                        try:
                            if any(self._match(fake, s, view) for s in subs):
                                return f" (device {dev['name']} is held by claim {ns}/{name})"
                        except CelError:
                            pass
        return ""

    def schedule(self, fake: Any, pod: dict[str, Any], node: str) -> str | None:
        """Allocate and reserve the pod's claims on ``node`` (lock held): None when done, else
        the scheduler's reason (nothing changed)."""
        ns = pod["metadata"]["namespace"]
        refs = pod["spec"].get("resourceClaims") or ()
        claims = []
        for ref in refs:
            name = ref.get("resourceClaimName")
            claim = fake.objects.get(("resourceclaims", ns, name or ""))
            if claim is None:
                return f'pod "{pod["metadata"]["name"]}": resourceclaim "{name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return f'resourceclaim "{name}" is being deleted'
            claims.append(claim)
        before = [copy.deepcopy(c.get("status")) for c in claims]
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                terms = allocation["nodeSelector"]["nodeSelectorTerms"]
                if terms[0]["matchFields"][0]["values"] != [node]:
                    reason = f"claim {claim['metadata']['name']} is allocated on another node"
                else:
                    reason = None
            else:
                reason = self._allocate_claim(fake, claim, node)
            if reason is not None:
                for c, status in zip(claims, before, strict=True):
                    c.pop("status", None)
                    if status is not None:
                        c["status"] = status
                return reason
        for claim in claims:
            claim["status"].setdefault("reservedFor", []).append(
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            )
            fake._record("resourceclaims", "MODIFIED", claim)
        return None

    def pod_gone(self, fake: Any, pod: Mapping[str, Any]) -> None:
        """Unreserve a deleted pod's claims; deallocate those nobody reserves (lock held)."""
        uid = pod["metadata"]["uid"]
        for key, claim in list(fake.objects.items()):
            if key[0] != "resourceclaims" or not claim.get("status"):
                continue
            reserved = claim["status"].get("reservedFor") or []
            kept = [r for r in reserved if r.get("uid") != uid]
            if kept == reserved:
                continue
            claim["status"]["reservedFor"] = kept
            if not kept:
                claim.pop("status")
                if claim["metadata"].get("deletionTimestamp"):
                    del fake.objects[key]
                    fake._record("resourceclaims", "DELETED", claim)
                    continue
            fake._record("resourceclaims", "MODIFIED", claim)

    # -- HTTP ---------------------------------------------------------------------------------

    def routes(self, fake: Any, base: type) -> list[tuple[str, type]]:
        """The ``resource.k8s.io/v1`` routes (the fake's bearer token required)."""
        dra = self

        class Handler(base):  # type: ignore[misc, valid-type]
            def prepare(self) -> None:
                super().prepare()
                if self._finished:
                    fake.unauthorized += 1
                else:
                    fake.calls.append((self.request.method, self.request.path))

            def reply(self, obj: Any, code: int = 200) -> None:
                self.set_status(code)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(obj))

            def items(self, plural: str, namespace: str | None, kind: str) -> None:
                fields = dict(
                    p.split("=", 1)
                    for p in self.get_argument("fieldSelector", "").split(",")
                    if "=" in p
                )
                with fake._lock:
                    out = []
                    for (p, ns, _), obj in sorted(fake.objects.items(), key=lambda kv: kv[0]):
                        if p != plural or (namespace is not None and ns != namespace):
                            continue
                        spec = obj.get("spec") or {}
                        if fields.get("spec.driver", spec.get("driver")) != spec.get("driver"):
                            continue
                        if fields.get("spec.nodeName", spec.get("nodeName")) != spec.get(
                            "nodeName"
                        ):
                            continue
                        out.append(copy.deepcopy(obj))
                    rv = fake._rv
                self.reply(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": f"{kind}List",
                        "metadata": {"resourceVersion": str(rv)},
                        "items": out,
                    }
                )

            def one(self, plural: str, namespace: str, name: str) -> None:
                with fake._lock:
                    found = copy.deepcopy(fake.objects.get((plural, namespace, name)))
                if found is None:
                    self.status(404, "NotFound", f'{plural}.resource.k8s.io "{name}" not found')
                else:
                    self.reply(found)

        class Discovery(Handler):
            def get(self) -> None:
                resources = [
                    ("deviceclasses", "DeviceClass", False),
                    ("resourceclaims", "ResourceClaim", True),
                    ("resourceslices", "ResourceSlice", False),
                ]
                self.reply(
                    {
                        "kind": "APIResourceList",
                        "apiVersion": "v1",
                        "groupVersion": "resource.k8s.io/v1",
                        "resources": [
                            {
                                "name": n,
                                "singularName": k.lower(),
                                "namespaced": ns,
                                "kind": k,
                                "verbs": ["create", "delete", "get", "list", "watch"],
                            }
                            for n, k, ns in resources
                        ],
                    }
                )

        class ClusterScoped(Handler):
            def get(self, plural: str, name: str | None = None) -> None:
                kind = {"deviceclasses": "DeviceClass", "resourceslices": "ResourceSlice"}[plural]
                if name is None:
                    self.items(plural, None, kind)
                else:
                    self.one(plural, "", name)

        class Claims(Handler):
            def get(self, namespace: str) -> None:
                self.items("resourceclaims", namespace, "ResourceClaim")

            def post(self, namespace: str) -> None:
                body = json.loads(self.request.body)
                meta = body.setdefault("metadata", {})
                name = meta.get("name", "")
                problems = dra.problems(body)
                if problems:
                    self.status(
                        422,
                        "Invalid",
                        f'ResourceClaim.resource.k8s.io "{name}" is invalid: '
                        + "; ".join(problems),
                    )
                    return
                with fake._lock:
                    if ("resourceclaims", namespace, name) in fake.objects:
                        self.status(
                            409,
                            "AlreadyExists",
                            f'resourceclaims.resource.k8s.io "{name}" already exists',
                        )
                        return
                    meta.update(
                        namespace=namespace,
                        uid=str(uuid.uuid4()),
                        creationTimestamp="2026-03-02T09:00:00Z",
                    )
                    body.pop("status", None)
                    fake.objects[("resourceclaims", namespace, name)] = body
                    fake._record("resourceclaims", "ADDED", body)
                    created = copy.deepcopy(body)
                self.reply(created, 201)

        class AllClaims(Handler):
            def get(self) -> None:  # every namespace's (the pool's occupancy reader)
                self.items("resourceclaims", None, "ResourceClaim")

        class Claim(Handler):
            def get(self, namespace: str, name: str) -> None:
                self.one("resourceclaims", namespace, name)

            def delete(self, namespace: str, name: str) -> None:
                key = ("resourceclaims", namespace, name)
                with fake._lock:
                    claim = fake.objects.get(key)
                    if claim is not None:
                        claim["metadata"]["deletionTimestamp"] = "2026-03-02T10:00:00Z"
                        if (claim.get("status") or {}).get("reservedFor"):
                            fake._record("resourceclaims", "MODIFIED", claim)
                        else:
                            del fake.objects[key]
                            fake._record("resourceclaims", "DELETED", claim)
                        claim = copy.deepcopy(claim)
                if claim is None:
                    self.status(
                        404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found'
                    )
                else:
                    self.reply(claim)

        return [
            (rf"{GROUP}/?", Discovery),
            (rf"{GROUP}/(deviceclasses|resourceslices)", ClusterScoped),
            (rf"{GROUP}/(deviceclasses|resourceslices)/([^/]+)", ClusterScoped),
            (rf"{GROUP}/resourceclaims", AllClaims),
            (rf"{GROUP}/namespaces/([^/]+)/resourceclaims", Claims),
            (rf"{GROUP}/namespaces/([^/]+)/resourceclaims/([^/]+)", Claim),
        ]


def run_spawners(scenario: Any) -> Any:
    """Run ``scenario()`` (a coroutine function driving KubeSpawners) on a new loop, with the
    spawner's DRA probe cache fresh and its reflectors and API clients gone afterwards, so no
    test sees another's."""
    from jupyterhub_gpupool.spawner import clusterapi
    from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner

    async def wrapped() -> Any:
        GPUPoolKubeSpawner._dra_probed.clear()
        try:
            return await scenario()
        finally:
            GPUPoolKubeSpawner._dra_probed.clear()
            await GPUPoolKubeSpawner._stop_all_reflectors()
            await clusterapi.close_clients()

    return asyncio.run(wrapped())
