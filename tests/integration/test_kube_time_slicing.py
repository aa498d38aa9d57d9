"""Shares only on nodes whose device plugin advertises time-slicing, learnt from a fake
Kubernetes API server over real HTTP (its NodeList JSON, a bearer token) by ``KubeSharing``,
written through the service's writer into the real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube import nodes as kn
from jupyterhub_gpupool.kube.sharing import KubeSharing
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.service.writer import BatchWriter
from jupyterhub_gpupool.store.errors import StoreError
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

PLAIN, SLICED = "kube-l4-a", "kube-l4-b"
POOL = {
    "nodes": [
        # declared as the operator believes; the nodes' device plugins have the last word
        {"name": PLAIN, "gpus": [{"model": "L4", "count": 2, "sharing": "shared"}]},
        {"name": SLICED, "gpus": [{"model": "L4", "count": 2, "sharing": "exclusive"}]},
    ],
    "offers": [
        {"name": "l4-q", "kind": "shared", "fraction": 0.25, "models": ["L4"]},
        {"name": "l4", "kind": "gpu", "models": ["L4"]},
    ],
    "quotas": {"default": {"guarantee": 0, "limit": 8}},
}


def time_slicing(node: dict, replicas: int = 4) -> dict:
    """What the GPU Operator's time-slicing config (renameByDefault) does to a node."""
    labels = node["metadata"]["labels"]
    labels[kn.SHARING_STRATEGY], labels[kn.REPLICAS] = "time-slicing", str(replicas)
    gpus = int(labels["nvidia.com/gpu.count"])
    for where in ("capacity", "allocatable"):
        node["status"][where].pop("nvidia.com/gpu", None)
        node["status"][where][kn.SHARED_RESOURCE] = str(gpus * replicas)
    return node


@pytest.fixture
def kube():
    nodes = [
        kube_node(PLAIN, product="NVIDIA-L4", gpus=2, memory_mib=23034),
        time_slicing(kube_node(SLICED, product="NVIDIA-L4", gpus=2, memory_mib=23034)),
    ]
    with FakeKubeAPI(nodes) as api:
        yield api


@pytest.fixture
def rig(db_url: str, kube: FakeKubeAPI, tmp_path: Path):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(kube.token + "\n")
    return store, KubeSharing(enabled=True, api_host=kube.url, token_file=str(token))


def run(store, sharing: KubeSharing, coro_fn):
    async def go():
        writer = BatchWriter(store)
        writer.start()
        try:
            return await coro_fn(writer.run)
        finally:
            writer.stop()
            await sharing.close()

    return asyncio.run(go())


def modes(store, node: str) -> list[str]:
    with store.locked() as alloc:
        return [g.sharing for g in alloc.nodes[node].gpus]


def test_shares_go_only_where_the_plugin_time_slices_and_follow_the_node(rig, kube):
    store, sharing = rig
    shared, whole = [gpu_uuid(SLICED, i) for i in range(2)], [gpu_uuid(PLAIN, i) for i in range(2)]

    async def first_round(call):
        return await sharing.step(store, call)

    # the declared modes were the wrong way round: the nodes put them right
    assert run(store, sharing, first_round) == {
        PLAIN: {whole[0]: "exclusive", whole[1]: "exclusive"},
        SLICED: {shared[0]: "shared", shared[1]: "shared"},
    }
    assert modes(store, PLAIN) == ["exclusive", "exclusive"]
    assert modes(store, SLICED) == ["shared", "shared"]
    events, _ = store.events(kind="sharing-advertised")
    assert [e.data["node"] for e in events] == [PLAIN, SLICED]
    # a quiet cluster: nothing to write
    assert run(store, sharing, first_round) == {}

    share = store.allocate("alice", "", "l4-q")
    assert share.state == "granted" and share.node == SLICED
    gpu = store.allocate("bob", "", "l4")
    assert gpu.state == "granted" and gpu.node == PLAIN

    # an agent's report (NVML cannot see the plugin's config: sharing auto) keeps the modes
    report = {
        "cluster": "default",
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA L4", "memory_mib": 23034}
            for i, u in enumerate(shared)
        ],
    }
    store.put_inventory(node_from_inventory(SLICED, report, default_catalog()), actor="agent")
    assert modes(store, SLICED) == ["shared", "shared"]

    # the operator turns time-slicing off on that node: it goes whole-GPU only; alice keeps hers
    labels = kube.nodes[SLICED]["metadata"]["labels"]
    labels[kn.SHARING_STRATEGY], labels[kn.REPLICAS] = "none", "1"
    for where in ("capacity", "allocatable"):
        kube.nodes[SLICED]["status"][where].pop(kn.SHARED_RESOURCE)
        kube.nodes[SLICED]["status"][where]["nvidia.com/gpu"] = "2"
    run(store, sharing, first_round)
    assert modes(store, SLICED) == ["exclusive", "exclusive"]
    assert store.lease(share.id).state == "granted"
    with pytest.raises(StoreError) as info:
        store.allocate("carol", "", "l4-q")
    assert info.value.code == "no_such_hardware"
    assert info.value.message.startswith(  # the field, then the pool's words
        "offer: no node in the pool offers shared GPUs (time-slicing) for offer 'l4-q'"
    )
    # whole GPUs are served there now
    assert store.allocate("dave", "", "l4").node in (PLAIN, SLICED)


def test_an_api_server_that_refuses_changes_nothing(rig, kube, tmp_path):
    store, sharing = rig
    (tmp_path / "token").write_text("not-the-token\n")

    async def one_round(call):
        return await sharing.step(store, call)

    assert run(store, sharing, one_round) == {}
    assert modes(store, SLICED) == ["exclusive", "exclusive"]  # as declared, until it can read


def test_the_charts_rights_let_it_read_the_nodes(db_url, tmp_path):
    """Against an API server enforcing the rendered chart's RBAC: with occupancy.enabled (nodes
    get and list) the round reads the nodes; without, the pool's service account has no role,
    the read is refused (403) and nothing changes."""
    pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")
    from tests.fakekube_rbac import SA_TOKEN, chart_rbac

    upgrade(db_url)
    nodes = [
        kube_node(PLAIN, product="NVIDIA-L4", gpus=2, memory_mib=23034),
        time_slicing(kube_node(SLICED, product="NVIDIA-L4", gpus=2, memory_mib=23034)),
    ]
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    for values, changed in (({}, False), ({"occupancy": {"enabled": True}}, True)):
        store = make_store(db_url, StoreClock(), POOL)
        rbac = chart_rbac(values)
        with FakeKubeAPI(nodes, authorizer=rbac) as api:
            sharing = KubeSharing(enabled=True, api_host=api.url, token_file=str(token))

            async def one_round(call, sharing=sharing, store=store):
                return await sharing.step(store, call)

            out = run(store, sharing, one_round)
        assert bool(out) is changed
        assert modes(store, SLICED) == (["shared", "shared"] if changed else ["exclusive"] * 2)
        assert [(r.verb, r.resource) for _, r in rbac.refused] == (
            [] if changed else [("list", "nodes")]
        )
