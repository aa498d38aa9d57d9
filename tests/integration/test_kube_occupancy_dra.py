"""GPUs held by ResourceClaims the pool did not make (the DRA path), against the fake Kubernetes
API server over real HTTP, enforcing the rendered chart's RBAC: the pool reads the driver's
ResourceSlices and every claim's allocation (``KubeOccupancy``, backend ``auto`` finding DRA),
never grants the exact GPU or MIG slice a training job's claim holds, shows who holds it, and
grants it again once the claim is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube.occupancy import KubeOccupancy
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.writer import BatchWriter
from tests.fakekube_dra import FakeDRA, nvidia_slice
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")
pytest.importorskip("kubernetes_validate")

from tests.fakekube_rbac import SA_TOKEN, chart_rbac

NODE = "dra-h100"
MIG_NODE = "dra-a100"
X, Y = gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)
A100 = gpu_uuid(MIG_NODE, 0)
POOL = {
    "nodes": [
        {"name": NODE, "gpus": [{"model": "H100-80GB"}, {"model": "H100-80GB"}]},
        {
            "name": MIG_NODE,
            "gpus": [
                {
                    "model": "A100-80GB",
                    "mig": {
                        "enabled": True,
                        "instances": [{"profile": "1g.10gb", "start": s} for s in range(3)],
                    },
                }
            ],
        },
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 0, "limit": 8}},
}
ADMIN = "admin-token"  # the test's own calls: kubectl as cluster-admin


def slices() -> list[dict[str, Any]]:
    return [
        nvidia_slice(NODE, [{"uuid": X}, {"uuid": Y}]),
        nvidia_slice(
            MIG_NODE,
            [
                {
                    "uuid": A100,
                    "product": "NVIDIA A100-SXM4-80GB",
                    "mig": [
                        {"profile": "1g.10gb", "start": s, "uuid": f"MIG-{s}"} for s in range(3)
                    ],
                }
            ],
        ),
    ]


def train_claim(name: str, expression: str, device_class: str = "gpu.nvidia.com") -> dict:
    """A training job's claim (not the pool's: no lease label)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def train_pod(name: str, claim: str, node: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "train", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def kubectl(kube: FakeKubeAPI, method: str, path: str, body: dict | None = None) -> dict:
    r = httpx.request(
        method, f"{kube.url}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert r.status_code < 300, r.text
    return r.json()


def start_training(kube: FakeKubeAPI, name: str, expression: str, node: str, cls: str) -> None:
    """A training job: its own claim, and a pod using it (the scheduler allocates it)."""
    kubectl(
        kube,
        "POST",
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims",
        train_claim(f"{name}-gpu", expression, cls),
    )
    kubectl(kube, "POST", "/api/v1/namespaces/ml/pods", train_pod(name, f"{name}-gpu", node))
    assert kube.objects_of("pods")[f"ml/{name}"]["status"]["phase"] == "Running"


def stop_training(kube: FakeKubeAPI, name: str) -> None:
    kubectl(kube, "DELETE", f"/api/v1/namespaces/ml/pods/{name}")
    kubectl(kube, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{name}-gpu")


def uuid_is(uuid: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'


@pytest.fixture
def rbac():
    found = chart_rbac({"occupancy": {"enabled": True}})
    found.admin_token = ADMIN
    return found


def run(store: Any, scenario: Any) -> Any:
    async def go():
        writer = BatchWriter(store)
        writer.start()
        try:
            return await scenario(writer.run)
        finally:
            writer.stop()

    return asyncio.run(go())


def test_a_gpu_a_training_claim_holds_is_never_granted_until_the_claim_is_gone(
    db_url: str, tmp_path: Path, rbac
):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    nodes = [kube_node(NODE, gpus=0), kube_node(MIG_NODE, gpus=0)]
    with FakeKubeAPI(nodes, token=ADMIN, dra=FakeDRA(slices()), authorizer=rbac) as kube:
        occupancy = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token))
        # the pool would grant X first (the lowest index): the training job holds exactly X
        start_training(kube, "train-0", uuid_is(X), NODE, "gpu.nvidia.com")

        async def rounds(call):
            try:
                first = await occupancy.step(store, call)
                alice = await call(commands.Allocate("alice", "", "h100"))
                bob = await call(commands.Allocate("bob", "", "h100"))
                shown = store.pool(detail=True)
                quiet = await occupancy.step(store, call)
                stop_training(kube, "train-0")
                freed = await occupancy.step(store, call)
                return first, alice, bob, shown, quiet, freed
            finally:
                await occupancy.close()

        first, alice, bob, shown, quiet, freed = run(store, rounds)
        assert rbac.refused == []  # the chart grants every call the reader makes
        calls = {path for _, path in kube.calls}
    assert "/apis/resource.k8s.io/v1/resourceclaims" in calls
    assert "/api/v1/pods" not in calls  # DRA found: pods are not read
    holder = "ml/train-0-gpu (pod train-0)"
    assert first[NODE]["gpus"] == [X] and first[NODE]["pods"] == [holder]
    assert first[NODE]["by"] == {X: holder} and first[NODE]["conflicts"] == []
    assert first[MIG_NODE]["instances"] == [] and first[MIG_NODE]["pods"] == []
    assert alice.state == "granted" and alice.slots[0].gpu == Y
    assert bob.state == "queued"
    (h100,) = [n for c in shown.clusters for n in c.nodes if n.name == NODE]
    assert [(g.outside, g.outside_by) for g in h100.gpus] == [(True, (holder,)), (False, ())]
    assert quiet == {}
    assert freed[NODE]["gpus"] == [] and freed[NODE]["pods"] == []
    after = store.lease(bob.id)
    assert after.state == "granted" and after.slots[0].gpu == X


def test_a_mig_slice_a_claim_holds_and_devices_no_slice_publishes_are_outside(
    db_url: str, tmp_path: Path, rbac
):
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    published = slices()
    published[0]["spec"]["devices"] = published[0]["spec"]["devices"][:1]  # GPU 1 unhealthy
    nodes = [kube_node(NODE, gpus=0), kube_node(MIG_NODE, gpus=0)]
    with FakeKubeAPI(nodes, token=ADMIN, dra=FakeDRA(published), authorizer=rbac) as kube:
        occupancy = KubeOccupancy(
            enabled=True, api_host=kube.url, token_file=str(token), backend="dra"
        )
        place = (
            f'device.attributes["gpu.nvidia.com"].parentUUID == "{A100}" && '
            '"memorySlice0" in device.capacity["gpu.nvidia.com"]'
        )
        start_training(kube, "infer-0", place, MIG_NODE, "mig.nvidia.com")

        async def rounds(call):
            try:
                marked = await occupancy.step(store, call)
                granted = [await call(commands.Allocate(f"u{i}", "", "a100-1g")) for i in range(3)]
                whole = await call(commands.Allocate("w", "", "h100"))
                return marked, granted, whole
            finally:
                await occupancy.close()

        marked, granted, whole = run(store, rounds)
    assert marked[MIG_NODE]["instances"] == [[A100, 0]]
    assert marked[MIG_NODE]["counts"] == {"1g.10gb": 1}
    assert marked[NODE]["gpus"] == [Y]
    assert marked[NODE]["pods"] == ["(not published by the DRA driver)"]
    assert [g.state for g in granted] == ["granted", "granted", "queued"]
    assert sorted(g.slots[0].start for g in granted[:2]) == [1, 2]
    assert whole.slots[0].gpu == X


def test_a_device_a_pool_lease_holds_is_a_conflict_said_not_hidden(
    db_url: str, tmp_path: Path, rbac
):
    """The pool granted X (its server's claim not made yet); a job's claim gets X first: the
    round says so (short, with both holders) and moves nothing."""
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    nodes = [kube_node(NODE, gpus=0), kube_node(MIG_NODE, gpus=0)]
    with FakeKubeAPI(nodes, token=ADMIN, dra=FakeDRA(slices()), authorizer=rbac) as kube:
        occupancy = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token))

        async def rounds(call):
            try:
                alice = await call(commands.Allocate("alice", "", "h100"))
                start_training(kube, "train-0", uuid_is(X), NODE, "gpu.nvidia.com")
                return alice, await occupancy.step(store, call)
            finally:
                await occupancy.close()

        alice, marked = run(store, rounds)
    assert alice.slots[0].gpu == X
    assert marked[NODE]["gpus"] == [] and marked[NODE]["short"] == {"gpu": 1}
    (conflict,) = marked[NODE]["conflicts"]
    assert X in conflict and "ml/train-0-gpu" in conflict and alice.id in conflict
    assert store.lease(alice.id).slots[0].gpu == X


def test_without_the_charts_dra_rules_the_reader_is_refused_and_changes_nothing(
    db_url: str, tmp_path: Path
):
    """occupancy.backend device-plugin renders no DRA rules: a reader told to use DRA is
    refused (403) and marks nothing; one on auto reads pods instead."""
    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    rbac = chart_rbac({"occupancy": {"enabled": True, "backend": "device-plugin"}})
    rbac.admin_token = ADMIN
    nodes = [kube_node(NODE, gpus=0), kube_node(MIG_NODE, gpus=0)]
    with FakeKubeAPI(nodes, token=ADMIN, dra=FakeDRA(slices()), authorizer=rbac) as kube:
        told = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token), backend="dra")
        auto = KubeOccupancy(enabled=True, api_host=kube.url, token_file=str(token))

        async def rounds(call):
            try:
                return await told.step(store, call), await auto.step(store, call)
            finally:
                await told.close()
                await auto.close()

        refused, fallen_back = run(store, rounds)
    assert refused == {}
    assert {(r.verb, r.resource) for _, r in rbac.refused} == {("list", "resourceslices")}
    # the device plugin advertises no GPU on these nodes: all of them are outside
    assert fallen_back[NODE]["counts"] == {"gpu": 2}
