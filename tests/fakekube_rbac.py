"""Kubernetes RBAC for the fake API server (``tests.fakes.FakeKubeAPI(authorizer=...)``).

A real API server authenticates the bearer token (401 ``Unauthorized`` when it names nobody)
and then asks its RBAC authorizer whether the user may do the request's *verb* on its
*resource*; a refusal is a 403 ``Forbidden`` Status naming user, verb, resource, API group and
scope. :class:`RBAC` does the same from the very manifests a Helm render produces (ClusterRoles,
Roles and their bindings), so a test of code against the fake fails exactly where the chart
does not grant what the code calls (https://kubernetes.io/docs/reference/access-authn-authz/rbac/,
"Determine the request verb" in https://kubernetes.io/docs/reference/access-authn-authz/authorization/).

Kept apart from ``tests/fakes/kube.py``: the fake only asks :meth:`RBAC.check` before each request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RBAC_KINDS = frozenset({"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"})


@dataclass(frozen=True)
class Request:
    """What RBAC judges: the verb, the API group, resource (``pods/log`` for a subresource),
    namespace (empty: cluster scope) and object name (empty for a collection)."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str


def parse(method: str, path: str, query: Mapping[str, str]) -> Request | None:
    """The RBAC attributes of a request (None: not a resource request, e.g. ``/version``)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    elif len(rest) == 2 and rest[0] == "namespaces":  # a Namespace itself
        return Request(_verb(method, True, query), group, "namespaces", "", rest[1])
    if not rest:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    return Request(_verb(method, bool(name), query), group, resource, namespace, name)


def _verb(method: str, one: bool, query: Mapping[str, str]) -> str:
    if method == "GET":
        if str(query.get("watch", "")).lower() in ("true", "1"):
            return "watch"
        return "get" if one else "list"
    if method == "DELETE":
        return "delete" if one else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _matches(rule: Mapping[str, Any], req: Request) -> bool:
    def has(key: str, value: str) -> bool:
        listed = rule.get(key) or []
        return "*" in listed or value in listed

    if rule.get("nonResourceURLs"):
        return False
    names = rule.get("resourceNames") or []
    return (
        has("apiGroups", req.group)
        and has("resources", req.resource)
        and has("verbs", req.verb)
        and (not names or req.name in names)
    )


def _subject_is(subject: Mapping[str, Any], user: str, groups: Iterable[str]) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace')}:{subject.get('name')}"
    if kind == "User":
        return user == subject.get("name")
    if kind == "Group":
        return subject.get("name") in set(groups)
    return False


class RBAC:
    """An authenticator (token → service account) and RBAC authorizer over manifests.

    ``tokens`` maps a bearer token to ``"namespace/name"`` of a service account (or a full user
    name such as ``system:admin``). ``admin_token`` is a user every request is allowed to (the
    test's own calls, as ``kubectl`` with cluster-admin).
    """

    def __init__(
        self,
        manifests: Iterable[Mapping[str, Any]],
        tokens: Mapping[str, str],
        *,
        admin_token: str = "",
    ) -> None:
        self.objects = [dict(m) for m in manifests if m and m.get("kind") in RBAC_KINDS]
        self.tokens = dict(tokens)
        self.admin_token = admin_token
        #: every refusal: (user, Request)
        self.refused: list[tuple[str, Request]] = []

    def _role(self, ref: Mapping[str, Any], namespace: str) -> list[Mapping[str, Any]]:
        for obj in self.objects:
            meta = obj["metadata"]
            if obj["kind"] != ref.get("kind") or meta["name"] != ref.get("name"):
                continue
            if obj["kind"] == "Role" and meta.get("namespace", "") != namespace:
                continue
            return obj.get("rules") or []
        return []  # a binding to a missing role grants nothing, as on a real server

    def user(self, authorization: str) -> str | None:
        """The user a bearer token names (None: nobody, a 401)."""
        token = authorization[len("Bearer ") :] if authorization.startswith("Bearer ") else ""
        if self.admin_token and token == self.admin_token:
            return "system:admin"
        who = self.tokens.get(token) if token else None
        if who is None:
            return None
        if "/" in who:
            namespace, name = who.split("/", 1)
            return f"system:serviceaccount:{namespace}:{name}"
        return who

    def allowed(self, user: str, req: Request) -> bool:
        """RBAC's answer: some binding of the user grants the verb on the resource there."""
        if user == "system:admin":
            return True
        groups = ["system:authenticated"]
        if user.startswith("system:serviceaccount:"):
            namespace = user.split(":")[2]
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        for binding in self.objects:
            kind = binding["kind"]
            if kind not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            if not any(_subject_is(s, user, groups) for s in binding.get("subjects") or []):
                continue
            where = binding["metadata"].get("namespace", "")
            if kind == "RoleBinding" and (not req.namespace or req.namespace != where):
                continue  # a RoleBinding grants in its own namespace only
            if any(_matches(rule, req) for rule in self._role(binding["roleRef"], where)):
                return True
        return False

    def check(
        self, method: str, path: str, query: Mapping[str, str], authorization: str
    ) -> tuple[int, str, str, dict[str, Any]] | None:
        """None to serve the request, else the refusal as (code, reason, message, details),
        in the API server's words."""
        user = self.user(authorization)
        if user is None:
            return 401, "Unauthorized", "Unauthorized", {}
        req = parse(method, path, query)
        if req is None or self.allowed(user, req):
            return None
        self.refused.append((user, req))
        resource, _, sub = req.resource.partition("/")
        what = f'{resource} "{req.name}"' if req.name else resource
        scope = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
        shown = f'resource "{resource}"' + (f' with subresource "{sub}"' if sub else "")
        message = (
            f'{what} is forbidden: User "{user}" cannot {req.verb} {shown} in API group '
            f'"{req.group}" {scope}'
        )
        details: dict[str, Any] = {"kind": resource}
        if req.name:
            details["name"] = req.name
        if req.group:
            details["group"] = req.group
        return 403, "Forbidden", message, details


def from_render(
    manifests: Iterable[Mapping[str, Any]],
    tokens: Mapping[str, str],
    *,
    namespace: str,
    admin_token: str = "",
) -> RBAC:
    """An authorizer from a Helm render (the RBAC kinds picked out of every manifest); the
    namespaced ones without a namespace are in ``namespace``, as ``helm install -n`` puts them."""
    picked = []
    for m in manifests:
        if not m or m.get("kind") not in RBAC_KINDS:
            continue
        m = dict(m)
        if m["kind"] in ("Role", "RoleBinding") and not m["metadata"].get("namespace"):
            m["metadata"] = {**m["metadata"], "namespace": namespace}
        picked.append(m)
    return RBAC(picked, tokens, admin_token=admin_token)


# -- the Helm chart's own RBAC ------------------------------------------------------------------

#: The pool's service account's token in its own cluster, in the tests of the chart's RBAC.
SA_TOKEN = "sa-gpupool-token"
CHART = Path(__file__).resolve().parents[1] / "helm" / "jupyterhub-gpupool"
CHART_NAMESPACE = "jhub"


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's manifests for ``values`` (Helm's engine, helm-python-sdk of the test
    extra), released as ``gpupool`` in ``CHART_NAMESPACE``."""
    import helm_python as helm
    import yaml

    with helm.Chart.load(CHART) as chart:
        files = chart.render(values=values, name="gpupool", namespace=CHART_NAMESPACE)
    return [
        doc
        for name, text in sorted(files.items())
        if not name.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def chart_rbac(values: dict[str, Any], rules: list[dict] | None = None) -> RBAC:
    """The rendered chart's RBAC, the pool's service account holding SA_TOKEN (``rules``
    replace its ClusterRole's, for a chart as it once was)."""
    manifests = render_chart(values)
    if rules is not None:
        for m in manifests:
            if m["kind"] == "ClusterRole":
                m["rules"] = rules
    return from_render(
        manifests, {SA_TOKEN: f"{CHART_NAMESPACE}/gpupool"}, namespace=CHART_NAMESPACE
    )
