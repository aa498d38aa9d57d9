"""GPUs held by pods the pool did not place (the device-plugin path), against the fake
Kubernetes API server over real HTTP: the pool reads its nodes and pods (``KubeOccupancy``),
never grants what a training pod holds, and grants it again once the pod ends; the fake API
server's scheduler subtracts running pods' GPUs, as the real one does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube.occupancy import KubeOccupancy
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.writer import BatchWriter
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

NODE = "kube-a100"
POOL = {
    "nodes": [{"name": NODE, "gpus": [{"model": "A100-80GB"}, {"model": "A100-80GB"}]}],
    "offers": [{"name": "a100", "kind": "gpu", "models": ["A100-80GB"]}],
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}


def pod(name: str, gpus: int, lease: str | None = None) -> dict:
    meta: dict = {"name": name}
    if lease:
        meta["annotations"] = {"gpupool.jupyter.org/lease": lease}
    return {
        "metadata": meta,
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "main",
                    "image": "train",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
        },
    }


@pytest.fixture
def kube():
    with FakeKubeAPI([kube_node(NODE, gpus=2)]) as api:
        yield api


def create(kube: FakeKubeAPI, namespace: str, body: dict) -> dict:
    r = httpx.post(
        f"{kube.url}/api/v1/namespaces/{namespace}/pods",
        json=body,
        headers={"Authorization": f"Bearer {kube.token}"},
    )
    assert r.status_code == 201, r.text
    return kube.objects_of("pods")[f"{namespace}/{body['metadata']['name']}"]


def test_the_fake_scheduler_subtracts_running_pods_gpus(kube):
    assert create(kube, "ml", pod("train-0", 2))["status"]["phase"] == "Running"
    late = create(kube, "ml", pod("train-1", 1))
    assert late["status"]["phase"] == "Pending" and "nodeName" not in late["spec"]
    (why,) = [
        e
        for e in kube.objects_of("events").values()
        if e["involvedObject"]["name"] == "train-1" and e["reason"] == "FailedScheduling"
    ]
    assert "Insufficient nvidia.com/gpu" in why["message"]
    kube.terminate("ml", "train-0")  # the GPUs come back: the scheduler retries
    assert kube.objects_of("pods")["ml/train-1"]["status"]["phase"] == "Running"


def test_a_gpu_a_training_pod_holds_is_never_granted_until_the_pod_ends(
    db_url: str, kube: FakeKubeAPI, tmp_path: Path
):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(kube.token)
    occupancy = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token))
    create(kube, "ml", pod("train-0", 1))

    async def rounds(call):
        first = await occupancy.step(store, call)
        alice = await call(commands.Allocate("alice", "", "a100"))
        bob = await call(commands.Allocate("bob", "", "a100"))
        # alice's server runs on the GPU the pool gave her; her pod is the pool's own
        create(kube, "jhub", pod("jupyter-alice", 1, lease=alice.id))
        quiet = await occupancy.step(store, call)
        kube.terminate("ml", "train-0")
        freed = await occupancy.step(store, call)
        await occupancy.close()
        return first, alice, bob, quiet, freed

    async def go():
        writer = BatchWriter(store)
        writer.start()
        try:
            return await rounds(writer.run)
        finally:
            writer.stop()

    first, alice, bob, quiet, freed = asyncio.run(go())
    assert first == {
        NODE: {
            "counts": {"gpu": 1},
            "gpus": [gpu_uuid(NODE, 1)],
            "instances": [],
            "short": {},
            "pods": ["ml/train-0"],
        }
    }
    assert alice.state == "granted" and alice.slots[0].gpu == gpu_uuid(NODE, 0)
    assert bob.state == "queued"  # the other GPU is the training pod's
    assert quiet == {}  # nothing changed: nothing written
    assert freed[NODE]["gpus"] == [] and freed[NODE]["pods"] == []
    after = store.lease(bob.id)
    assert after.state == "granted" and after.slots[0].gpu == gpu_uuid(NODE, 1)
    kinds = [e.kind for e in store.events(limit=50)[0]]
    assert kinds.count("outside-holds") == 2
    # the map shows the mark while it stands (none now)
    gpus = store.pool(detail=True).clusters[0].nodes[0].gpus
    assert [g.outside for g in gpus] == [False, False]


MIG_NODE = "kube-mig"
MIG_POOL = {
    "nodes": [
        {
            "name": MIG_NODE,
            "gpus": [
                {
                    "model": "A100-80GB",
                    "mig": {
                        "enabled": True,
                        "instances": [{"profile": "1g.10gb", "start": s} for s in range(7)],
                    },
                }
            ],
        }
    ],
    "offers": [{"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]}],
    "quotas": {"default": {"guarantee": 0, "limit": 8}},
}


def test_mig_slices_an_inference_pod_holds_are_never_granted(db_url: str, tmp_path: Path):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), MIG_POOL)
    token = tmp_path / "token"
    with FakeKubeAPI([kube_node(MIG_NODE, config="all-1g.10gb")]) as kube:
        token.write_text(kube.token)
        occupancy = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token))
        infer = pod("infer-0", 0)
        infer["metadata"]["name"] = "infer-0"
        infer["spec"]["nodeSelector"] = {"kubernetes.io/hostname": MIG_NODE}
        infer["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": 5}}
        assert create(kube, "serve", infer)["status"]["phase"] == "Running"

        async def rounds(call):
            try:
                marked = await occupancy.step(store, call)
                granted = [await call(commands.Allocate(f"u{i}", "", "a100-1g")) for i in range(3)]
                return marked, granted
            finally:
                await occupancy.close()

        async def go():
            writer = BatchWriter(store)
            writer.start()
            try:
                return await rounds(writer.run)
            finally:
                writer.stop()

        marked, granted = asyncio.run(go())
    assert marked[MIG_NODE]["counts"] == {"1g.10gb": 5}
    assert len(marked[MIG_NODE]["instances"]) == 5
    assert [g.state for g in granted] == ["granted", "granted", "queued"]
    gpu = store.pool(detail=True).clusters[0].nodes[0].gpus[0]
    states = sorted(i.state for i in gpu.instances)
    assert states == ["outside"] * 5 + ["present"] * 2
    assert all(i.lease is None for i in gpu.instances if i.state == "outside")
