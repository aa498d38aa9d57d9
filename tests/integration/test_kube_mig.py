"""MIG on Kubernetes: re-partitions through mig-manager's ``nvidia.com/mig.config`` label,
against a fake Kubernetes API server over real HTTP (its JSON, its merge patches, a simulated
mig-manager that flips ``nvidia.com/mig.config.state``), with the real store on SQLite and
PostgreSQL and the service's writer. Also what the pool reads from nodes' labels."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube import nodes as kn
from jupyterhub_gpupool.kube.client import KubeAPI, KubeClient, KubeError
from jupyterhub_gpupool.kube.labeller import MigLabeller
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.writer import BatchWriter
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

NODE = "kube-a100"
GPU = gpu_uuid(NODE, 0)
SEVEN = [{"profile": "1g.10gb", "start": s} for s in range(7)]
TWO_3G = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
POOL = {
    "nodes": [
        {
            "name": NODE,
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "instances": SEVEN}}],
        }
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}


@pytest.fixture
def clock() -> StoreClock:
    return StoreClock()


@pytest.fixture
def kube():
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")]) as api:
        yield api


@pytest.fixture
def rig(db_url: str, clock: StoreClock, kube: FakeKubeAPI, tmp_path: Path):
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    token = tmp_path / "token"
    token.write_text(kube.token + "\n")
    labeller = MigLabeller(enabled=True, api_host=kube.url, token_file=str(token))
    return store, labeller


def run(store, labeller, coro_fn):
    """Run ``coro_fn(call)`` with the service's writer started (the one write path)."""

    async def go():
        writer = BatchWriter(store)
        writer.start()
        try:
            return await coro_fn(writer.run)
        finally:
            writer.stop()
            await labeller.client().close()
            labeller._client = None

    return asyncio.run(go())


def instances(store) -> list[tuple[str, int]]:
    with store.locked() as alloc:
        return sorted((i.profile, i.start) for i in alloc.nodes[NODE].gpus[0].instances)


def cordoned(store) -> bool:
    with store.locked() as alloc:
        return alloc.nodes[NODE].gpus[0].cordoned


def test_a_repartition_waits_for_leases_then_labels_waits_for_success_and_uncordons(rig, kube):
    store, labeller = rig
    held = store.allocate("alice", "", "a100-1g")
    assert held.state == "granted"
    rep = store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
    assert rep.state == "waiting" and rep.method == "label" and cordoned(store)

    async def rounds(call):
        seen = [await labeller.step(store, call)]  # waiting for alice: not the labeller's yet
        assert kube.patches == []
        await call(commands.Release(held.id))
        await call(commands.AdvanceRepartitions())
        seen.append(await labeller.step(store, call))  # label it
        seen.append(await labeller.step(store, call))  # mig-manager did not start
        kube.mig_manager_step(NODE)
        seen.append(await labeller.step(store, call))
        kube.mig_manager_step(NODE)
        seen.append(await labeller.step(store, call))
        return seen

    seen = run(store, labeller, rounds)
    assert seen == [{}, {NODE: "labelled"}, {NODE: "waiting"}, {NODE: "pending"}, {NODE: "done"}]
    # one merge patch: the config, and the stale state removed in the same change
    assert kube.patches == [
        (
            NODE,
            "application/merge-patch+json",
            {"metadata": {"labels": {kn.MIG_CONFIG: "all-3g.40gb", kn.MIG_STATE: None}}},
        )
    ]
    node = kube.node(NODE)
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"
    assert instances(store) == [("3g.40gb", 0), ("3g.40gb", 4)]
    (done,) = store.repartitions(node=NODE)
    assert done.state == "done" and done.error is None
    assert not cordoned(store)
    assert store.allocate("bob", "", "a100-3g").state == "granted"


def test_a_failed_mig_manager_is_surfaced_with_the_nodes_message(rig, kube):
    store, labeller = rig
    kube.failing["all-3g.40gb"] = "failed to destroy GPU instance 3: In use by another client"
    store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
    assert store.repartitions(node=NODE)[0].state == "applying"

    async def rounds(call):
        seen = [await labeller.step(store, call)]
        kube.mig_manager_step(NODE)
        kube.mig_manager_step(NODE)
        seen.append(await labeller.step(store, call))
        return seen

    assert run(store, labeller, rounds) == [{NODE: "labelled"}, {NODE: "failed"}]
    (rep,) = store.repartitions(node=NODE)
    assert rep.state == "failed"
    assert rep.error == (
        "mig-manager set nvidia.com/mig.config.state=failed applying all-3g.40gb on node "
        "kube-a100: failed to destroy GPU instance 3: In use by another client"
    )
    assert kube.node(NODE)["metadata"]["labels"][kn.MIG_STATE] == "failed"
    assert instances(store) == [("1g.10gb", s) for s in range(7)]  # the old layout stays
    assert not cordoned(store)  # the cordon it had before


def test_a_layout_no_mig_parted_config_gives_fails_without_touching_the_node(rig, kube):
    store, labeller = rig
    mixed = [{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 4}]
    store.request_repartition(NODE, GPU, mixed, actor="admin")
    assert run(store, labeller, lambda call: labeller.step(store, call)) == {NODE: "failed"}
    (rep,) = store.repartitions(node=NODE)
    assert "no mig-parted config gives node kube-a100 the layout 1×3g.40gb, 1×1g.10gb" in (
        rep.error
    )
    assert kube.patches == []


def test_a_custom_config_is_used_by_name(rig, kube):
    store, labeller = rig
    labeller.configs = {"half-3g": {"3g.40gb": 1, "1g.10gb": 3}}
    kube.configs = {**kube.configs, "half-3g": {"3g.40gb": 1, "1g.10gb": 3}}
    layout = [{"profile": "3g.40gb", "start": 0}] + [
        {"profile": "1g.10gb", "start": s} for s in (4, 5, 6)
    ]
    store.request_repartition(NODE, GPU, layout, actor="admin")

    async def rounds(call):
        await labeller.step(store, call)
        kube.mig_manager_step(NODE)
        kube.mig_manager_step(NODE)
        return await labeller.step(store, call)

    assert run(store, labeller, rounds) == {NODE: "done"}
    assert kube.node(NODE)["metadata"]["labels"][kn.MIG_CONFIG] == "half-3g"
    assert instances(store) == [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6), ("3g.40gb", 0)]


def test_a_node_the_api_server_does_not_have_fails_the_repartition(db_url, clock, tmp_path):
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    with FakeKubeAPI([kube_node("elsewhere")]) as kube:
        token = tmp_path / "token"
        token.write_text(kube.token)
        labeller = MigLabeller(enabled=True, api_host=kube.url, token_file=str(token))
        store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
        assert run(store, labeller, lambda call: labeller.step(store, call)) == {NODE: "failed"}
    assert "not a node of the Kubernetes API" in store.repartitions(node=NODE)[0].error


def test_an_api_server_that_is_away_changes_nothing(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    with FakeKubeAPI([]) as kube:
        url = kube.url
    labeller = MigLabeller(enabled=True, api_host=url)  # nobody listens there any more
    store.request_repartition(NODE, GPU, TWO_3G, actor="admin")
    assert run(store, labeller, lambda call: labeller.step(store, call)) == {NODE: "unreachable"}
    assert store.repartitions(node=NODE)[0].state == "applying"


# -- the client and what nodes say -------------------------------------------------------------


def test_the_client_reads_nodes_and_is_refused_without_the_token(kube):
    async def go():
        good = KubeClient(KubeAPI(kube.url, token=kube.token))
        bad = KubeClient(KubeAPI(kube.url, token="wrong"))
        try:
            names = [
                n["metadata"]["name"] for n in await good.list_nodes("nvidia.com/gpu.present=true")
            ]
            none = await good.list_nodes("nvidia.com/gpu.present=false")
            with pytest.raises(KubeError) as e:
                await bad.get_node(NODE)
            with pytest.raises(KubeError) as missing:
                await good.get_node("nope")
            return names, none, e.value, missing.value
        finally:
            await good.close()
            await bad.close()

    names, none, refused, missing = asyncio.run(go())
    assert names == [NODE] and none == []
    assert refused.status == 401 and "Unauthorized" in str(refused)
    assert missing.status == 404 and 'nodes "nope" not found' in str(missing)


def test_slice_counts_from_allocatable_then_from_feature_discovery_labels():
    node = kube_node("n", gpus=2, config="all-1g.10gb")
    assert kn.slice_counts(node) == {"1g.10gb": 14}
    assert kn.whole_gpus(node) == 0
    node["status"]["allocatable"] = {"cpu": "8"}  # the device plugin restarting
    assert kn.slice_counts(node) == {"1g.10gb": 14}  # gpu-feature-discovery's count
    plain = kube_node("p", gpus=4, config="all-disabled")
    assert kn.slice_counts(plain) == {} and kn.whole_gpus(plain) == 4


def test_default_configs_are_mig_parteds_all_profile_ones():
    configs = kn.default_configs([default_catalog().model("A100-80GB")])
    assert configs["all-disabled"] == {}
    assert configs["all-1g.10gb"] == {"1g.10gb": 7}
    assert configs["all-3g.40gb"] == {"3g.40gb": 2}
    assert kn.config_for({"3g.40gb": 2}, configs) == "all-3g.40gb"
    assert kn.config_for({"3g.40gb": 1, "1g.10gb": 1}, configs) is None
