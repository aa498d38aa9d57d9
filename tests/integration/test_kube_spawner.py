"""``GPUPoolKubeSpawner`` against a real pool service (and hub), without a Kubernetes cluster.

The spawner asks the real service for the lease (simulated GPUs, MIG instances created by the
in-process simulated NVML), then KubeSpawner builds the pod it would create; the manifest is
checked against literal values and validated against the Kubernetes schemas. Only the cluster
client is absent (KubeSpawner's own ``_mock`` mode).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jupyterhub_gpupool.data import data_path
from tests.fakes import HubEnv, request

pytestmark = pytest.mark.e2e

kubespawner = pytest.importorskip("kubespawner.spawner")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner  # noqa: E402
from jupyterhub_gpupool.spawner.objects import check_pod_manifest  # noqa: E402

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {
        "display_name": "A100 slice",
        "slug": "a100-1g",
        "description": "One seventh of an A100",
        # a stale-looking override the pool must replace, not add to
        "kubespawner_override": {
            "gpupool_offer": "a100-1g",
            "extra_resource_limits": {"nvidia.com/gpu": "1"},
        },
    },
    {"display_name": "H100", "slug": "h100", "kubespawner_override": {"gpupool_offer": "h100"}},
]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    where = tmp_path_factory.mktemp("kube")
    env = HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        data_path("demo-pool.yaml"),
        service_args=(
            "--PoolService.telemetry_source=sim",
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        yield env


def make_spawner(pool: HubEnv, monkeypatch, user: str, options: dict, **traits):
    monkeypatch.setattr(kubespawner, "load_config", lambda **kw: None)
    monkeypatch.setattr(kubespawner, "shared_client", lambda name: None)
    fake_user = SimpleNamespace(
        name=user, groups=[], settings={}, url=f"/user/{user}/", id=1, escaped_name=user
    )
    spawner = GPUPoolKubeSpawner(
        _mock=True,
        user=fake_user,
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        **traits,
    )
    spawner.user_options = options
    return spawner


def manifest_of(spawner) -> dict:
    from kubernetes_asyncio.client import ApiClient

    async def build():
        await spawner.load_user_options()
        pod = await spawner.get_pod_manifest()
        async with ApiClient() as api:
            return api.sanitize_for_serialization(pod)

    manifest = asyncio.run(build())
    for version in ("1.30", "1.35"):
        kubernetes_validate.validate(manifest, desired_version=version, strict=True)
    check_pod_manifest(manifest)
    return manifest


def live(pool: HubEnv, user: str) -> list[dict]:
    r = request("GET", f"{pool.api}/allocations?user={user}", pool.spawner_token)
    return [le for le in r.json()["items"] if le["state"] != "released"]


def test_profile_with_an_offer_pins_the_pod_to_the_granted_slice(pool, monkeypatch):
    spawner = make_spawner(
        pool, monkeypatch, "alice", {"profile": "a100-1g"}, profile_list=PROFILES
    )
    asyncio.run(spawner.run_pre_spawn_hook())
    lease = spawner.gpupool_lease
    assert lease["offer"] == "a100-1g" and lease["state"] == "granted" and lease["ready"]
    manifest = manifest_of(spawner)
    container = manifest["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    assert manifest["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "sim-a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in manifest[
        "spec"
    ]["tolerations"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPOOL_LEASE_ID"] == lease["id"] and env["GPUPOOL_OFFER"] == "a100-1g"
    assert manifest["metadata"]["labels"]["gpupool.jupyter.org/lease"] == lease["id"]
    assert spawner.get_state()["gpupool"]["lease"] == lease["id"]
    asyncio.run(spawner.release_lease())
    assert live(pool, "alice") == []


def test_cpu_profile_strips_gpu_resources(pool, monkeypatch):
    spawner = make_spawner(
        pool,
        monkeypatch,
        "bob",
        {"profile": "cpu"},
        profile_list=PROFILES,
        extra_resource_limits={"nvidia.com/gpu": "1", "memory": "4G"},
        extra_resource_guarantees={"nvidia.com/gpu": "1"},
    )
    asyncio.run(spawner.run_pre_spawn_hook())
    assert spawner.gpupool_lease is None and live(pool, "bob") == []
    container = manifest_of(spawner)["spec"]["containers"][0]
    limits = container["resources"].get("limits", {})
    assert not any(k.startswith("nvidia.com/") for k in limits)
    assert not any(k.startswith("nvidia.com/") for k in container["resources"].get("requests", {}))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_form_annotates_gpu_profiles_with_live_availability(pool, monkeypatch):
    spawner = make_spawner(pool, monkeypatch, "alice", {}, profile_list=PROFILES)
    form = asyncio.run(spawner.get_options_form())
    assert "One seventh of an A100 — 14 free now · costs 1/7 GPU" in form
    assert "2 free now · costs 1 GPU" in form


def test_picker_without_profiles_keeps_the_choice(pool, monkeypatch):
    spawner = make_spawner(pool, monkeypatch, "alice", {})
    form = asyncio.run(spawner.get_options_form())
    assert 'name="gpupool_offer"' in form and "A100 · 1g.10gb slice" in form
    assert spawner.options_from_form({"gpupool_offer": ["h100"]}) == {"gpupool_offer": "h100"}


def test_forged_offer_outside_pool_offers_is_refused(pool, monkeypatch):
    spawner = make_spawner(
        pool, monkeypatch, "alice", {"gpupool_offer": "h100"}, pool_offers=["a100-1g"]
    )
    with pytest.raises(Exception, match="not available here") as info:
        asyncio.run(spawner.run_pre_spawn_hook())
    assert getattr(info.value, "status_code", None) == 403
    assert live(pool, "alice") == []
