"""``fallback: true`` offers with DRA: the server's claim names the granted device first and
free devices of the same offer on the same node after it (``firstAvailable``), against a real
pool service and the fake Kubernetes API server over real HTTP (whose scheduler takes the
first subrequest it can satisfy, as Kubernetes does). The granted GPU taken by a training
job's claim between grant and pod → the pod gets the fallback and the lease is rebound to it;
a fallback the pool has meanwhile granted to another server → the spawn fails saying so, its
pod and claim deleted and its lease given back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.fakekube_dra import FakeDRA, nvidia_slice
from tests.fakekube_dra import run_spawners as run
from tests.fakes import FakeKubeAPI, HubEnv, kube_node, kubeconfig, request, write_pool

pytestmark = pytest.mark.e2e

pytest.importorskip("kubespawner.spawner")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from jupyterhub_gpupool.spawner import dra  # noqa: E402
from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner  # noqa: E402

NS = "default"
NODE = "fb-h100"
H100 = [f"GPU-0d7a0000-0000-4000-8000-00000000010{i}" for i in range(3)]
POOL = f"""
nodes:
  - name: {NODE}
    gpus:
{chr(10).join(f"      - {{model: H100-80GB, uuid: {u}, sharing: exclusive}}" for u in H100)}
offers:
  - {{name: h100, kind: gpu, count: 1, models: [H100-80GB], fallback: true}}
quotas:
  default: {{guarantee: 0, limit: 4}}
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    where = tmp_path_factory.mktemp("kubedrafb")
    env = HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        write_pool(where, POOL),
        service_args=(
            "--PoolService.telemetry_source=sim",
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        yield env


@pytest.fixture
def kube(tmp_path):
    slices = [nvidia_slice(NODE, [{"uuid": u} for u in H100])]
    api = FakeKubeAPI([kube_node(NODE, gpus=0)], token="fb-token", dra=FakeDRA(slices))
    config_file = tmp_path / "kubeconfig"
    config_file.write_text(json.dumps(kubeconfig({"dra": api}, "dra")))
    with api, pytest.MonkeyPatch.context() as mp:
        from kubernetes_asyncio.config import kube_config

        mp.setenv("KUBECONFIG", str(config_file))
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config_file))
        mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield api


def make_spawner(pool, kube, user: str) -> GPUPoolKubeSpawner:
    fake_user = SimpleNamespace(
        name=user, groups=[], settings={}, url=f"/user/{user}/", id=1, escaped_name=user
    )
    spawner = GPUPoolKubeSpawner(
        _mock=True,
        user=fake_user,
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        k8s_api_host=kube.url,
        start_timeout=30,
    )
    spawner.user_options = {"gpupool_offer": "h100"}
    return spawner


def train_on(kube, gpu: str) -> None:
    """A training job (not the pool's) claims exactly ``gpu``; its pod runs on it."""
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [
            {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{gpu}"'}}
        ],
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trainer-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    pod = {
        "metadata": {"name": "trainer"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "resourceClaims": [{"name": "g", "resourceClaimName": "trainer-gpu"}],
            "containers": [
                {"name": "t", "image": "train", "resources": {"claims": [{"name": "g"}]}}
            ],
        },
    }
    kube_post(kube, "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims", claim)
    kube_post(kube, "/api/v1/namespaces/ml/pods", pod)
    assert kube.objects_of("pods")["ml/trainer"]["status"]["phase"] == "Running"


def kube_post(kube, path: str, body: dict) -> None:
    import httpx

    r = httpx.post(
        f"{kube.url}{path}", json=body, headers={"Authorization": f"Bearer {kube.token}"}
    )
    assert r.status_code == 201, r.text


def lease_of(pool, lease_id: str) -> dict:
    return request("GET", f"{pool.api}/allocations/{lease_id}", pool.spawner_token).json()


def test_the_granted_gpu_taken_first_the_pod_gets_the_fallback_and_the_lease_follows(pool, kube):
    async def scenario():
        s = make_spawner(pool, kube, "ada")
        await s.run_pre_spawn_hook()
        lease = dict(s.gpupool_lease)
        train_on(kube, lease["slots"][0]["gpu"])  # between the grant and the pod
        await s.start()
        claim = kube.objects_of("resourceclaims")[f"{NS}/{s.pod_name}-gpu"]
        pod = kube.objects_of("pods")[f"{NS}/{s.pod_name}"]
        after = lease_of(pool, lease["id"])
        devices = s.dra_devices
        await s.stop()
        return lease, claim, pod, after, devices

    lease, claim, pod, after, devices = run(scenario)
    granted = lease["slots"][0]["gpu"]
    assert granted == H100[0]
    # the lease shown to the spawner names the other free GPUs of the offer on its node
    assert lease["fallback"] == [
        {"gpu": H100[1], "kind": "gpu", "profile": None, "start": None},
        {"gpu": H100[2], "kind": "gpu", "profile": None, "start": None},
    ]
    (request_,) = claim["spec"]["devices"]["requests"]
    assert "exactly" not in request_
    subs = request_["firstAvailable"]
    assert [s["name"] for s in subs] == ["granted", "fallback-0", "fallback-1"]
    assert [s["selectors"][0]["cel"]["expression"] for s in subs] == [
        f'device.attributes["gpu.nvidia.com"].uuid == "{u}"' for u in H100
    ]
    for version in ("1.34", "1.35"):
        kubernetes_validate.validate(
            {k: v for k, v in claim.items() if k != "status"}, desired_version=version, strict=True
        )
    (result,) = dra.results(claim)
    assert result["request"] == "gpu-0/fallback-0" and result["device"] == "gpu-1"
    assert pod["status"]["phase"] == "Running"
    assert devices[0]["gpu"] == H100[1] and devices[0]["matches"] is False
    # rebound: idle judgement, the panel and chargeback follow the fallback GPU
    assert [s["gpu"] for s in after["slots"]] == [H100[1]]
    assert "fallback" not in after  # active now: nothing to fall back to


def test_a_fallback_granted_to_another_server_meanwhile_fails_the_spawn_and_says_so(pool, kube):
    async def scenario():
        ada = make_spawner(pool, kube, "ada")
        await ada.run_pre_spawn_hook()
        bob = make_spawner(pool, kube, "bob")
        await bob.run_pre_spawn_hook()  # the pool grants bob the next GPU, ada's fallback
        ada_lease, bob_lease = dict(ada.gpupool_lease), dict(bob.gpupool_lease)
        train_on(kube, ada_lease["slots"][0]["gpu"])
        with pytest.raises(Exception) as info:
            await ada.start()
        left = set(kube.objects_of("resourceclaims")), set(kube.objects_of("pods"))
        after = lease_of(pool, ada_lease["id"]), lease_of(pool, bob_lease["id"])
        await bob.release_lease("test over")
        return ada_lease, bob_lease, info.value, left, after, ada.pod_name

    ada_lease, bob_lease, error, (claims, pods), (ada_after, bob_after), pod = run(scenario)
    assert ada_lease["fallback"][0]["gpu"] == bob_lease["slots"][0]["gpu"] == H100[1]
    message = getattr(error, "jupyterhub_message", str(error))
    assert f"granted ({H100[0]})" in message and f"instead ({H100[1]})" in message
    assert "granted to lease" in message and "start it again" in message
    assert f"{NS}/{pod}-gpu" not in claims and f"{NS}/{pod}" not in pods
    assert ada_after["state"] == "released"
    assert [s["gpu"] for s in bob_after["slots"]] == [H100[1]]  # bob keeps his GPU
