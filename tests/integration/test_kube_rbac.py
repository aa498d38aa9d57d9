"""The MIG labeller against a fake API server that enforces RBAC (issue 33, items 5, 7 and 8).

The Roles are the Helm chart's own, rendered by Helm's engine (helm-python-sdk), or the
cross-cluster manifest the multi-cluster how-to ships (helm/examples/cross-cluster-rbac.yaml);
the fake API server (real HTTP) answers 403 with the API server's Status for anything they do
not grant, so the code and the chart are tested together: a right the code needs and the chart
lacks fails here, as it would on a cluster.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube import nodes as kn
from jupyterhub_gpupool.kube.labeller import MigLabeller
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.writer import BatchWriter
from tests.fakekube_rbac import RBAC, SA_TOKEN, chart_rbac, from_render
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

helm = pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "jupyterhub-gpupool"
CROSS_CLUSTER = ROOT / "helm" / "examples" / "cross-cluster-rbac.yaml"
NAMESPACE = "jhub"
NODE = "kube-a100"
GPU = gpu_uuid(NODE, 0)
SEVEN = [{"profile": "1g.10gb", "start": s} for s in range(7)]
TWO_3G = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
OFFERS = [
    {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
]
A100 = {"model": "A100-80GB", "mig": {"enabled": True, "instances": SEVEN}}
POOL = {
    "nodes": [{"name": NODE, "gpus": [A100]}],
    "offers": OFFERS,
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}
FAILS = "failed to destroy GPU instance 3: In use by another client"
#: The ClusterRole the chart had before issue 33: no events list (and reads it never used).
OLD_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
]


def labeller_for(kube: FakeKubeAPI, tmp_path: Path, token: str = SA_TOKEN) -> MigLabeller:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    return MigLabeller(enabled=True, api_host=kube.url, token_file=str(token_file))


def run(store, labeller: MigLabeller, coro_fn):
    """Run ``coro_fn(call)`` with the service's writer (the one write path)."""

    async def go():
        writer = BatchWriter(store)
        writer.start()
        try:
            return await coro_fn(writer.run)
        finally:
            writer.stop()
            await labeller.close()

    return asyncio.run(go())


def cordoned(store, node: str = NODE) -> bool:
    with store.locked() as alloc:
        return alloc.nodes[node].gpus[0].cordoned


def instances(store, node: str = NODE) -> list[tuple[str, int]]:
    with store.locked() as alloc:
        return sorted((i.profile, i.start) for i in alloc.nodes[node].gpus[0].instances)


@pytest.fixture
def store(db_url: str):
    upgrade(db_url)
    return make_store(db_url, StoreClock(), POOL)


def rounds_until_mig_manager_answers(kube: FakeKubeAPI, labeller: MigLabeller, store):
    async def rounds(call):
        seen = [await labeller.step(store, call)]  # label
        kube.mig_manager_step(NODE)  # pending
        kube.mig_manager_step(NODE)  # failed or success
        seen.append(await labeller.step(store, call))
        seen.append(await labeller.step(store, call))  # nothing left: it ended
        return seen

    return rounds


@pytest.mark.parametrize("outcome", ["failed", "done"])
def test_the_charts_rbac_lets_a_repartition_end_either_way(store, tmp_path, outcome) -> None:
    rbac = chart_rbac({"mig": {"repartition": {"enabled": True}}})
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")], authorizer=rbac) as kube:
        if outcome == "failed":
            kube.failing["all-3g.40gb"] = FAILS
        labeller = labeller_for(kube, tmp_path)
        store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
        assert cordoned(store)
        seen = run(store, labeller, rounds_until_mig_manager_answers(kube, labeller, store))
    assert seen == [{NODE: "labelled"}, {NODE: outcome}, {}]
    assert rbac.refused == []  # every call the labeller made, the chart grants
    (rep,) = store.repartitions(node=NODE)
    assert rep.state == outcome
    if outcome == "failed":
        assert rep.error == (
            "mig-manager set nvidia.com/mig.config.state=failed applying all-3g.40gb on node "
            f"kube-a100: {FAILS}"
        )
        assert instances(store) == [("1g.10gb", s) for s in range(7)]
    else:
        assert instances(store) == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert not cordoned(store)  # the GPU is handed back either way


def test_a_chart_without_events_list_fails_the_repartition_with_a_permission_error(
    store, tmp_path
) -> None:
    """The issue's reproduction: the old ClusterRole. The 403 on the events used to be read as
    an API server that is away ("unreachable", retried for ever, the GPU cordoned)."""
    rbac = chart_rbac({"mig": {"repartition": {"enabled": True}}}, rules=OLD_RULES)
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")], authorizer=rbac) as kube:
        kube.failing["all-3g.40gb"] = FAILS
        labeller = labeller_for(kube, tmp_path)
        store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
        seen = run(store, labeller, rounds_until_mig_manager_answers(kube, labeller, store))
    assert seen == [{NODE: "labelled"}, {NODE: "failed"}, {}]
    (rep,) = store.repartitions(node=NODE)
    assert rep.state == "failed"
    error = rep.error
    assert error.startswith(
        "mig-manager set nvidia.com/mig.config.state=failed applying all-3g.40gb on node "
        "kube-a100 (its events: the Kubernetes API refused the pool's service account"
    )
    assert (
        'events is forbidden: User "system:serviceaccount:jhub:gpupool" cannot list resource '
        '"events" in API group "" at the cluster scope'
    ) in error
    assert "list on events" in error and "mig.repartition.enabled" in error
    assert [(u, r.verb, r.resource) for u, r in rbac.refused] == [
        ("system:serviceaccount:jhub:gpupool", "list", "events")
    ]
    assert not cordoned(store)
    assert instances(store) == [("1g.10gb", s) for s in range(7)]


def test_without_the_right_to_read_nodes_the_repartition_fails_at_once(store, tmp_path) -> None:
    """The chart's defaults grant nothing: a labeller turned on by hand is refused."""
    rbac = chart_rbac({})
    assert rbac.objects == []  # no role at all without re-partitioning or occupancy
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")], authorizer=rbac) as kube:
        labeller = labeller_for(kube, tmp_path)
        store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
        seen = run(store, labeller, lambda call: labeller.step(store, call))
        assert kube.patches == []
    assert seen == {NODE: "failed"}
    (rep,) = store.repartitions(node=NODE)
    assert 'nodes "kube-a100" is forbidden' in rep.error
    assert 'cannot get resource "nodes"' in rep.error
    assert not cordoned(store)


def test_a_wrong_token_is_a_permission_error_too(store, tmp_path) -> None:
    rbac = chart_rbac({"mig": {"repartition": {"enabled": True}}})
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")], authorizer=rbac) as kube:
        labeller = labeller_for(kube, tmp_path, token="stale")
        store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
        seen = run(store, labeller, lambda call: labeller.step(store, call))
    assert seen == {NODE: "failed"}
    assert "401 Unauthorized" in store.repartitions(node=NODE)[0].error


# -- the authorizer itself, over HTTP -------------------------------------------------------


def test_the_fake_answers_like_an_rbac_api_server() -> None:
    manifests = [
        {
            "kind": "Role",
            "metadata": {"name": "pod-reader", "namespace": "jhub"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader", "namespace": "jhub"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": "jhub"}],
            "roleRef": {"kind": "Role", "name": "pod-reader"},
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "one-node"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["nodes"],
                    "verbs": ["get"],
                    "resourceNames": ["kube-a100"],
                }
            ],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "one-node"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:jhub"}],
            "roleRef": {"kind": "ClusterRole", "name": "one-node"},
        },
    ]
    rbac = RBAC(manifests, {"hub-token": "jhub/hub", "other-token": "elsewhere/hub"})
    nodes = [kube_node("kube-a100"), kube_node("kube-b")]
    with FakeKubeAPI(nodes, authorizer=rbac) as kube:

        def get(path: str, token: str, **params: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.get(kube.url + path, params=params, headers=headers, timeout=10)

        assert get("/api/v1/namespaces/jhub/pods", "hub-token").status_code == 200
        watch = get("/api/v1/namespaces/jhub/pods", "hub-token", watch="true", timeoutSeconds="0")
        assert watch.status_code == 200
        # a RoleBinding grants in its namespace only; get is not list
        elsewhere = get("/api/v1/namespaces/default/pods", "hub-token")
        assert elsewhere.status_code == 403
        assert elsewhere.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'pods is forbidden: User "system:serviceaccount:jhub:hub" cannot list '
            'resource "pods" in API group "" in the namespace "default"',
            "reason": "Forbidden",
            "details": {"kind": "pods"},
            "code": 403,
        }
        assert get("/api/v1/namespaces/jhub/pods/p", "hub-token").status_code == 403
        # resourceNames: that node only; the group binding reaches every jhub account only
        assert get("/api/v1/nodes/kube-a100", "hub-token").status_code == 200
        refused = get("/api/v1/nodes/kube-b", "hub-token")
        assert refused.status_code == 403
        assert refused.json()["details"] == {"kind": "nodes", "name": "kube-b"}
        assert get("/api/v1/nodes/kube-a100", "other-token").status_code == 403
        unknown = get("/api/v1/nodes/kube-a100", "nobody")
        assert unknown.status_code == 401 and unknown.json()["reason"] == "Unauthorized"
        # a verb from the method: a merge patch is "patch"
        patch = httpx.patch(
            kube.url + "/api/v1/nodes/kube-a100",
            json={"metadata": {"labels": {"x": "y"}}},
            headers={
                "Authorization": "Bearer hub-token",
                "Content-Type": "application/merge-patch+json",
            },
            timeout=10,
        )
        assert patch.status_code == 403 and "cannot patch" in patch.json()["message"]
        assert "x" not in kube.node("kube-a100")["metadata"]["labels"]


# -- one pool, two clusters (item 8) --------------------------------------------------------

TWO_CLUSTERS = {
    "clusters": ["eu", "us"],
    "nodes": [
        {"name": "eu-a100", "cluster": "eu", "gpus": [A100]},
        {"name": "us-a100", "cluster": "us", "gpus": [A100]},
    ],
    "offers": OFFERS,
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}


def test_one_pool_repartitions_each_clusters_nodes_through_that_clusters_api(
    db_url, tmp_path
) -> None:
    """The pool runs in ``eu`` (its chart's ClusterRole); ``us`` grants it the how-to's
    cross-cluster manifest only. Each node is labelled through its own cluster's API server
    with that cluster's token; neither token works in the other cluster."""
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), TWO_CLUSTERS)
    eu_rbac = chart_rbac({"mig": {"repartition": {"enabled": True}}})
    us_manifests = list(yaml.safe_load_all(CROSS_CLUSTER.read_text()))
    us_rbac = from_render(us_manifests, {"us-token": "gpupool-remote/gpupool-remote"}, namespace="")
    eu_node = kube_node("eu-a100", config="all-1g.10gb")
    us_node = kube_node("us-a100", config="all-1g.10gb")
    with (
        FakeKubeAPI([eu_node], authorizer=eu_rbac) as eu,
        FakeKubeAPI([us_node], authorizer=us_rbac) as us,
    ):
        (tmp_path / "us-token").write_text("us-token")
        labeller = labeller_for(eu, tmp_path)
        labeller.cluster_apis = {"us": {"host": us.url, "token_file": str(tmp_path / "us-token")}}
        us.failing["all-3g.40gb"] = "the us node's GPU is in use"
        store.request_repartition("eu-a100", gpu_uuid("eu-a100", 0), TWO_3G, actor="admin")
        store.request_repartition("us-a100", gpu_uuid("us-a100", 0), TWO_3G, actor="admin")

        async def rounds(call):
            seen = [await labeller.step(store, call)]
            for api, node in ((eu, "eu-a100"), (us, "us-a100")):
                api.mig_manager_step(node)
                api.mig_manager_step(node)
            seen.append(await labeller.step(store, call))
            return seen

        seen = run(store, labeller, rounds)
        assert [p[0] for p in eu.patches] == ["eu-a100"]  # each API saw its own node only
        assert [p[0] for p in us.patches] == ["us-a100"]
        # the tokens are the clusters' own
        for api, token in ((us, SA_TOKEN), (eu, "us-token")):
            r = httpx.get(f"{api.url}/api/v1/nodes/x", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 401
    assert seen == [
        {"eu-a100": "labelled", "us-a100": "labelled"},
        {"eu-a100": "done", "us-a100": "failed"},
    ]
    assert eu_rbac.refused == [] and us_rbac.refused == []
    by_node = {r.node: r for r in store.repartitions()}
    assert by_node["eu-a100"].state == "done"
    assert by_node["us-a100"].error.endswith(": the us node's GPU is in use")
    assert instances(store, "eu-a100") == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert not cordoned(store, "us-a100") and not cordoned(store, "eu-a100")
    assert kn.MIG_CONFIG in us.node("us-a100")["metadata"]["labels"]


def test_cluster_apis_are_checked_when_the_config_loads() -> None:
    from traitlets import TraitError

    with pytest.raises(TraitError, match=r"cluster_apis\['us'\] needs a host"):
        MigLabeller(cluster_apis={"us": {"token_file": "/t"}})
    with pytest.raises(TraitError, match="unknown key"):
        MigLabeller(cluster_apis={"us": {"host": "https://h", "token": "x"}})
