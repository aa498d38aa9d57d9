"""``GPUPoolKubeSpawner`` against a real pool service (and hub) and Kubernetes API servers over
real HTTP, one per cluster.

The spawner asks the real service for the lease (simulated GPUs, MIG instances created by the
in-process simulated NVML), then KubeSpawner talks to the API of the lease's cluster: three
``tests.fakes.FakeKubeAPI`` servers stand for the clusters ``home`` (KubeSpawner's own client,
from ``$KUBECONFIG``), ``east`` (``cluster_apis`` by host, CA and token file, over TLS) and
``west`` (``cluster_apis`` by a kube config context). Nothing is patched: the pod, its PVC and
Service are created, watched (KubeSpawner's reflectors), polled and deleted through HTTP, each
server accepting only its own bearer token. Pod manifests are also validated against the
Kubernetes schemas.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyterhub_gpupool.data import data_path
from tests.fakes import (
    FakeKubeAPI,
    HubEnv,
    kube_node,
    kubeconfig,
    request,
    self_signed_cert,
    write_pool,
)

pytestmark = pytest.mark.e2e

kubespawner = pytest.importorskip("kubespawner.spawner")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from jupyterhub_gpupool.spawner import clusterapi  # noqa: E402
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

#: The demo pool's nodes in cluster ``home``, plus a MIG A30 in ``east`` and an L4 in ``west``.
CLUSTERS = """
clusters: [home, east, west]
nodes:
  - name: east-a30
    cluster: east
    gpus:
      - model: A30-24GB
        mig:
          enabled: true
          instances: [{profile: 1g.6gb, start: 0}, {profile: 1g.6gb, start: 1}]
  - name: west-l4
    cluster: west
    gpus: [{model: L4, count: 1}]
"""

EXTRA_OFFERS = """
  - {name: a30-1g, kind: mig, profile: 1g.6gb, models: [A30-24GB], clusters: [east],
     display_name: "A30 slice"}
  - {name: l4, kind: gpu, count: 1, models: [L4], clusters: [west],
     display_name: "1× L4"}
"""

NS = "default"


def pool_yaml() -> str:
    demo = Path(data_path("demo-pool.yaml")).read_text()
    nodes = demo.replace("  - name: sim-", "  - cluster: home\n    name: sim-")
    nodes = nodes[nodes.index("nodes:\n") + len("nodes:\n") : nodes.index("offers:\n")]
    offers = demo[demo.index("offers:\n") : demo.index("quotas:")]
    return CLUSTERS + nodes + offers + EXTRA_OFFERS.lstrip("\n") + demo[demo.index("quotas:") :]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    where = tmp_path_factory.mktemp("kube")
    env = HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        write_pool(where, pool_yaml()),
        service_args=(
            "--PoolService.telemetry_source=sim",
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        yield env


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    """The three clusters' API servers and the spawner settings that reach them."""
    where = tmp_path_factory.mktemp("kubeapis")
    cert, key = self_signed_cert(where)
    home = FakeKubeAPI(
        [
            kube_node("sim-a100", gpus=2, config="all-1g.10gb"),
            kube_node("sim-h100", gpus=2, product="NVIDIA-H100-80GB-HBM3"),
        ],
        token="home-token",
    )
    east = FakeKubeAPI(
        [
            kube_node(
                "east-a30",
                product="NVIDIA-A30",
                memory_mib=24576,
                config="two-1g",
                configs={"two-1g": {"1g.6gb": 2}},
            )
        ],
        token="east-token",
        tls=(cert, key),
    )
    west = FakeKubeAPI([kube_node("west-l4", product="NVIDIA-L4")], token="west-token")
    config_file = where / "kubeconfig"
    config_file.write_text(json.dumps(kubeconfig({"home": home, "west-admin": west}, "home")))
    token_file = where / "east-token"
    token_file.write_text("east-token\n")
    cluster_apis = {
        "east": {"host": east.url, "ssl_ca_cert": str(cert), "token_file": str(token_file)},
        "west": {"context": "west-admin", "config_file": str(config_file)},
    }
    with home, east, west, pytest.MonkeyPatch.context() as mp:
        # KubeSpawner's own client (cluster home) comes from $KUBECONFIG, as with kubectl. The
        # client library reads the variable once, when it is imported (a hub has it in its
        # environment from the start): here its copy of the path is set as the variable would
        from kubernetes_asyncio.config import kube_config

        mp.setenv("KUBECONFIG", str(config_file))
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config_file))
        mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield SimpleNamespace(home=home, east=east, west=west, cluster_apis=cluster_apis)


def make_spawner(pool: HubEnv, kube, user: str, options: dict, **traits) -> GPUPoolKubeSpawner:
    """A spawner as the hub makes one (inside its event loop: KubeSpawner's client needs it)."""
    fake_user = SimpleNamespace(
        name=user, groups=[], settings={}, url=f"/user/{user}/", id=1, escaped_name=user
    )
    spawner = GPUPoolKubeSpawner(
        _mock=True,
        user=fake_user,
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        # KubeSpawner configures its client once per host (load_config is cached): naming the
        # host makes this module's kube config count whatever other tests did before
        k8s_api_host=kube.home.url,
        cluster_apis=kube.cluster_apis,
        flat_network=True,
        start_timeout=60,
        **traits,
    )
    spawner.user_options = options
    return spawner


def run(scenario) -> object:
    """Run ``scenario()`` in a fresh event loop, then stop the reflectors it started (they
    are per class, and live in that loop)."""

    async def wrapped():
        try:
            return await scenario()
        finally:
            await GPUPoolKubeSpawner._stop_all_reflectors()
            await clusterapi.close_clients()

    return asyncio.run(wrapped())


async def manifest_of(spawner) -> dict:
    from kubernetes_asyncio.client import ApiClient

    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:
        manifest = api.sanitize_for_serialization(pod)
    for version in ("1.30", "1.35"):
        kubernetes_validate.validate(manifest, desired_version=version, strict=True)
    check_pod_manifest(manifest)
    return manifest


def live(pool: HubEnv, user: str) -> list[dict]:
    r = request("GET", f"{pool.api}/allocations?user={user}", pool.spawner_token)
    return [le for le in r.json()["items"] if le["state"] != "released"]


def calls(api: FakeKubeAPI) -> int:
    return len(api.calls)


# -- one spawn per cluster, through that cluster's API server ------------------------------


@pytest.mark.parametrize(
    ("user", "offer", "cluster", "node", "resource"),
    [
        ("erin", "a30-1g", "east", "east-a30", "nvidia.com/mig-1g.6gb"),  # host + CA + token
        ("wade", "l4", "west", "west-l4", "nvidia.com/gpu"),  # a kube config context
        ("hana", "h100", "home", "sim-h100", "nvidia.com/gpu"),  # no entry: KubeSpawner's own
    ],
)
def test_the_pod_is_created_watched_and_deleted_in_the_lease_cluster(
    pool, kube, user, offer, cluster, node, resource
):
    servers = {"home": kube.home, "east": kube.east, "west": kube.west}
    here = servers[cluster]
    others = [s for name, s in servers.items() if name != cluster]
    before = {name: calls(s) for name, s in servers.items()}
    traits = {"storage_pvc_ensure": True, "storage_capacity": "1Gi", "services_enabled": True}

    async def scenario():
        spawner = make_spawner(pool, kube, user, {"gpupool_offer": offer}, **traits)
        await spawner.run_pre_spawn_hook()
        lease = spawner.gpupool_lease
        assert lease["cluster"] == cluster and lease["node"] == node
        url = await spawner.start()
        key = f"{NS}/{spawner.pod_name}"
        pod = here.objects_of("pods")[key]
        services = here.objects_of("services")
        assert await spawner.poll() is None
        state = spawner.get_state()
        # the hub restarts: a new spawner from the saved state finds the pod in its cluster
        again = make_spawner(pool, kube, user, {})
        again.load_state(state)
        assert await again.poll() is None
        await again.stop()
        return lease, url, pod, key, services

    lease, url, pod, key, services = run(scenario)
    # the pod ran where the pool put it: the lease's node and device, on its cluster's server
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": node}
    assert spec["nodeName"] == node and pod["status"]["phase"] == "Running"
    container = spec["containers"][0]
    assert container["resources"]["limits"][resource] == "1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPOOL_LEASE_ID"] == lease["id"] and env["GPUPOOL_OFFER"] == offer
    assert pod["metadata"]["labels"]["gpupool.jupyter.org/lease"] == lease["id"]
    # with its PVC and Service there too (the hub reaches the server through the Service);
    # after the stop the pod is gone (its Service with it: owned by the pod), the lease released
    name = pod["metadata"]["name"]
    assert url == f"http://{name}.{NS}.svc.cluster.local:8888"
    assert f"{NS}/claim-{lease['user']}" in here.objects_of("persistentvolumeclaims")
    owner = services[f"{NS}/{name}"]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Pod" and owner["uid"] == pod["metadata"]["uid"]
    assert key not in here.objects_of("pods") and f"{NS}/{name}" not in here.objects_of("services")
    assert live(pool, user) == []
    # every call went to this cluster's server with its token; none to the others
    assert calls(here) > before[cluster] and here.unauthorized == 0
    methods = {m for m, _ in here.calls}
    assert {"GET", "POST", "DELETE"} <= methods
    for other in others:
        assert f"{NS}/{name}" not in other.objects_of("pods")
        assert other.unauthorized == 0
    assert all(calls(s) == before[n] for n, s in servers.items() if s is not here)


def test_two_clusters_at_once_keep_a_reflector_each(pool, kube):
    """One hub process, two spawns in one event loop: each cluster's pods are watched through
    that cluster's API (KubeSpawner keeps one reflector per key, shared by the class)."""

    async def scenario():
        east = make_spawner(pool, kube, "ella", {"gpupool_offer": "a30-1g"})
        west = make_spawner(pool, kube, "walt", {"gpupool_offer": "l4"})
        await asyncio.gather(east.run_pre_spawn_hook(), west.run_pre_spawn_hook())
        await asyncio.gather(east.start(), west.start())
        seen = {
            key: set(r.pods) for key, r in GPUPoolKubeSpawner.reflectors.items() if key[0] == "pods"
        }
        await asyncio.gather(east.stop(), west.stop())
        return seen, east.pod_name, west.pod_name

    seen, east_pod, west_pod = run(scenario)
    assert seen[("pods", NS, "east")] == {f"{NS}/{east_pod}"}
    assert seen[("pods", NS, "west")] == {f"{NS}/{west_pod}"}
    assert live(pool, "ella") == live(pool, "walt") == []


def test_a_cluster_api_that_refuses_the_token_fails_the_spawn_naming_the_cluster(pool, kube):
    east = kube.cluster_apis["east"]
    apis = {**kube.cluster_apis, "east": {**east, "token": "not-easts-token"}}
    del apis["east"]["token_file"]
    refused = kube.east.unauthorized

    async def scenario():
        spawner = make_spawner(pool, kube, "nina", {"gpupool_offer": "a30-1g"})
        spawner.cluster_apis = apis
        await spawner.run_pre_spawn_hook()
        assert spawner.gpupool_lease["cluster"] == "east"
        try:
            with pytest.raises(Exception) as info:
                await spawner.start()
            return info.value
        finally:
            await spawner.release_lease()

    error = run(scenario)
    assert "The Kubernetes API of cluster east refused this hub's credentials (401" in str(error)
    assert getattr(error, "status_code", None) == 503
    assert kube.east.unauthorized > refused
    assert live(pool, "nina") == []


# -- the pod manifest and the form (cluster home) -------------------------------------------


def test_profile_with_an_offer_pins_the_pod_to_the_granted_slice(pool, kube):
    async def scenario():
        spawner = make_spawner(
            pool,
            kube,
            "alice",
            {"profile": "a100-1g"},
            profile_list=PROFILES,
            runtime_class_name="nvidia",
        )
        await spawner.run_pre_spawn_hook()
        lease = spawner.gpupool_lease
        assert lease["offer"] == "a100-1g" and lease["state"] == "granted" and lease["ready"]
        manifest = await manifest_of(spawner)
        state = spawner.get_state()
        await spawner.release_lease()
        return lease, manifest, state

    lease, manifest, state = run(scenario)
    container = manifest["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    assert manifest["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "sim-a100"}
    assert manifest["spec"]["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in manifest[
        "spec"
    ]["tolerations"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPOOL_LEASE_ID"] == lease["id"] and env["GPUPOOL_OFFER"] == "a100-1g"
    assert manifest["metadata"]["labels"]["gpupool.jupyter.org/lease"] == lease["id"]
    assert state["gpupool"]["lease"] == lease["id"] and state["gpupool"]["cluster"] == "home"
    assert live(pool, "alice") == []


def test_cpu_profile_strips_gpu_resources(pool, kube):
    async def scenario():
        spawner = make_spawner(
            pool,
            kube,
            "bob",
            {"profile": "cpu"},
            profile_list=PROFILES,
            extra_resource_limits={"nvidia.com/gpu": "1", "memory": "4G"},
            extra_resource_guarantees={"nvidia.com/gpu": "1"},
            # left from a GPU spawn of this spawner: a CPU-only pod must not keep it
            runtime_class_name="nvidia",
            extra_pod_config={"runtimeClassName": "nvidia"},
        )
        await spawner.run_pre_spawn_hook()
        assert spawner.gpupool_lease is None
        return await manifest_of(spawner)

    manifest = run(scenario)
    assert "runtimeClassName" not in manifest["spec"]
    container = manifest["spec"]["containers"][0]
    assert live(pool, "bob") == []
    limits = container["resources"].get("limits", {})
    assert not any(k.startswith("nvidia.com/") for k in limits)
    assert not any(k.startswith("nvidia.com/") for k in container["resources"].get("requests", {}))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_form_annotates_gpu_profiles_with_live_availability(pool, kube):
    async def scenario():
        return await make_spawner(pool, kube, "alice", {}, profile_list=PROFILES).get_options_form()

    form = run(scenario)
    assert "One seventh of an A100 — 14 free now · costs 1/7 GPU" in form
    assert "2 free now · costs 1 GPU" in form


def test_form_says_where_an_offer_of_another_cluster_runs(pool, kube):
    profiles = [
        *PROFILES,
        {"display_name": "L4", "slug": "l4", "kubespawner_override": {"gpupool_offer": "l4"}},
    ]

    async def scenario():
        spawner = make_spawner(
            pool, kube, "alice", {}, profile_list=profiles, pool_clusters=["home", "east"]
        )
        return await spawner.get_options_form()

    form = run(scenario)
    assert "unavailable: runs only in cluster west, where this hub does not launch" in form
    assert "2 free now · costs 1 GPU" in form  # the home H100s still count


def test_picker_without_profiles_keeps_the_choice(pool, kube):
    async def scenario():
        spawner = make_spawner(pool, kube, "alice", {})
        return spawner, await spawner.get_options_form()

    spawner, form = run(scenario)
    assert 'name="gpupool_offer"' in form and "A100 · 1g.10gb slice" in form
    assert spawner.options_from_form({"gpupool_offer": ["h100"]}) == {"gpupool_offer": "h100"}


def test_forged_offer_outside_pool_offers_is_refused(pool, kube):
    async def scenario():
        spawner = make_spawner(
            pool, kube, "alice", {"gpupool_offer": "h100"}, pool_offers=["a100-1g"]
        )
        with pytest.raises(Exception, match="not available here") as info:
            await spawner.run_pre_spawn_hook()
        return info.value

    assert getattr(run(scenario), "status_code", None) == 403
    assert live(pool, "alice") == []


def test_launching_into_other_clusters_is_refused_unless_the_network_is_declared_flat(kube):
    """One hub over several clusters needs their pods to reach it and its proxy their pods:
    refused when the config loads unless declared (the supported topology is a hub per
    cluster sharing one pool)."""
    from traitlets import TraitError
    from traitlets.config import Config

    config = Config()
    config.GPUPoolKubeSpawner.cluster_apis = kube.cluster_apis
    config.GPUPoolKubeSpawner.k8s_api_host = kube.home.url

    async def scenario():  # KubeSpawner builds its client in a running loop
        with pytest.raises(
            TraitError, match=r"\(east, west\) needs a flat network.*flat_network = True"
        ):
            GPUPoolKubeSpawner(_mock=True, config=config)
        # declared after cluster_apis in the same config: the whole config is judged
        config.GPUPoolKubeSpawner.flat_network = True
        declared = GPUPoolKubeSpawner(_mock=True, config=config)
        one = GPUPoolKubeSpawner(_mock=True, k8s_api_host=kube.home.url)
        return declared.cluster_apis, one.cluster_apis

    declared, one = run(scenario)
    assert set(declared) == {"east", "west"}
    assert one == {}  # one cluster: nothing to declare
