"""A MIG grant where NVIDIA's DRA driver makes MIG instances per claim (``DynamicMIG``).

A real pool service (``MigLabeller.dra_dynamic_mig`` naming the node, its labeller on and
pointed at the fake API server) and ``GPUPoolKubeSpawner`` against a Kubernetes API server over
real HTTP whose driver publishes the A100 as partitionable (a counter set, abstract MIG
devices consuming memory-slice counters: ``tests.fakekube_dra.nvidia_partitioned_slices``).
The grant is ready at once, nobody labels the node, no agent is asked to make an instance,
and the pod's claim is allocated to a partition of the granted profile on the granted GPU.
Then the same over the store directly: re-partitioning such a GPU is refused. And the hub's
rights: an API server enforcing RBAC with z2jh's hub Role and ``helm/examples/hub-dra-rbac.yaml``
serves the DRA spawn, and refuses every DRA call without the example.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.fakekube_dra import FakeDRA, nvidia_partitioned_slices
from tests.fakekube_dra import run_spawners as run
from tests.fakekube_rbac import from_render
from tests.fakes import FakeKubeAPI, HubEnv, kube_node, kubeconfig, request, write_pool

pytestmark = pytest.mark.e2e

kubespawner = pytest.importorskip("kubespawner.spawner")

from jupyterhub_gpupool.spawner import dra  # noqa: E402
from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner  # noqa: E402

NS = "default"
HUB_NS = "jhub"  # the namespace helm/examples/hub-dra-rbac.yaml is written for
HUB_TOKEN = "hub-sa-token"
EXAMPLE = Path(__file__).resolve().parents[2] / "helm" / "examples" / "hub-dra-rbac.yaml"
#: zero-to-jupyterhub's hub Role and its binding (jupyterhub/templates/hub/rbac.yaml, z2jh 4.4.0)
Z2JH_HUB_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "hub"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                "verbs": ["get", "watch", "list", "create", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "hub"},
        "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": HUB_NS}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
    },
]
NODE = "dyn-a100"
A100 = "GPU-0d7a0000-0000-4000-8000-00000000d1a0"
A100_OFF = "GPU-0d7a0000-0000-4000-8000-00000000d1a9"
POOL = f"""
nodes:
  - name: {NODE}
    gpus:
      - {{model: A100-80GB, uuid: {A100}, mig: {{enabled: true}}}}
offers:
  - {{name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}}
  - {{name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB]}}
quotas:
  default: {{guarantee: 0, limit: 8}}
"""


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    where = tmp_path_factory.mktemp("dynmigapi")
    slices = nvidia_partitioned_slices(NODE, [{"uuid": A100, "model": "A100-80GB"}])
    api = FakeKubeAPI([kube_node(NODE)], token="dyn-token", dra=FakeDRA(slices))
    example = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    tokens = {HUB_TOKEN: f"{HUB_NS}/hub"}
    full = from_render([*Z2JH_HUB_RBAC, *example], tokens, namespace=HUB_NS)
    z2jh_only = from_render(Z2JH_HUB_RBAC, tokens, namespace=HUB_NS)
    rbac = FakeKubeAPI([kube_node(NODE)], token=HUB_TOKEN, dra=FakeDRA(slices), authorizer=full)
    bare = FakeKubeAPI(
        [kube_node(NODE)], token=HUB_TOKEN, dra=FakeDRA(slices), authorizer=z2jh_only
    )
    config_file = where / "kubeconfig"
    config_file.write_text(json.dumps(kubeconfig({"dra": api, "rbac": rbac}, "dra")))
    token = where / "token"
    token.write_text(api.token + "\n")
    with api, rbac, bare, pytest.MonkeyPatch.context() as mp:
        from kubernetes_asyncio.config import kube_config

        mp.setenv("KUBECONFIG", str(config_file))
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config_file))
        mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield SimpleNamespace(
            api=api,
            token_file=str(token),
            rbac=rbac,
            bare=bare,
            rules=(full, z2jh_only),
            config_file=str(config_file),
        )


@pytest.fixture(scope="module")
def pool(tmp_path_factory, kube):
    where = tmp_path_factory.mktemp("dynmig")
    env = HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        write_pool(where, POOL),
        service_args=(
            "--PoolService.telemetry_source=sim",
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.housekeeping_interval=0.2",
            "--MigLabeller.enabled=True",
            f"--MigLabeller.api_host={kube.api.url}",
            f"--MigLabeller.token_file={kube.token_file}",
            f"--MigLabeller.dra_dynamic_mig={NODE}",
        ),
    )
    with env.running():
        yield env


def make_spawner(pool, kube, user, offer, **traits) -> GPUPoolKubeSpawner:
    fake_user = SimpleNamespace(
        name=user, groups=[], settings={}, url=f"/user/{user}/", id=1, escaped_name=user
    )
    spawner = GPUPoolKubeSpawner(
        _mock=True,
        user=fake_user,
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        k8s_api_host=kube.api.url,
        start_timeout=60,
        mem_limit="4G",
        **traits,
    )
    spawner.user_options = {"gpupool_offer": offer}
    return spawner


def test_a_mig_grant_is_made_by_the_claim_on_the_granted_parent_without_a_label(pool, kube):
    async def scenario():
        small = make_spawner(pool, kube, "alice", "a100-1g")
        big = make_spawner(pool, kube, "bob", "a100-3g")
        for s in (small, big):
            await s.run_pre_spawn_hook()
            await s.start()
        claims = kube.api.objects_of("resourceclaims")
        seen = [
            (s.gpupool_lease, claims[f"{NS}/{s.pod_name}-gpu"], s.dra_devices) for s in (small, big)
        ]
        plan = request("GET", f"{pool.api}/nodes/{NODE}/mig-plan", pool.agent_token).json()
        await asyncio.sleep(1.0)  # several housekeeping rounds, each with a labeller step
        await asyncio.gather(small.stop(), big.stop())
        return seen, plan

    seen, plan = run(scenario)
    slices = kube.api.objects_of("resourceslices").values()
    used = set()
    for lease, claim, devices in seen:
        (slot,) = lease["slots"]
        # the pool planned a new instance on its dynamic GPU, and the grant was ready at once
        assert slot["gpu"] == A100 and lease["ready"] and lease["state"] in ("granted", "active")
        # the claim names parent and profile (placement is in the counters, which CEL cannot
        # see) and got an abstract partition device of that profile on that GPU
        (request_,) = claim["spec"]["devices"]["requests"]
        assert request_["exactly"]["selectors"][0]["cel"]["expression"] == (
            f'device.attributes["gpu.nvidia.com"].parentUUID == "{A100}" && '
            f'device.attributes["gpu.nvidia.com"].profile == "{slot["profile"]}"'
        )
        (got,) = dra.allocated_devices(claim, slices)
        assert got["type"] == "mig" and got["parent_uuid"] == A100
        assert got["profile"] == slot["profile"]
        assert got["device"].startswith(
            {"1g.10gb": "gpu-0-mig-1g10gb-19-", "3g.40gb": "gpu-0-mig-3g40gb-9-"}[slot["profile"]]
        )
        assert devices[0]["matches"] and devices[0]["gpu"] == A100
        device = dra.slice_devices(slices)[(NODE, got["device"])]
        mine = set(dra.memory_slices(device))
        assert not mine & used  # two partitions of one GPU never share a memory slice
        used |= mine
    # no label change, nothing for an agent to make: the claims made the instances
    assert kube.api.patches == []
    assert plan["actions"] == []
    # stopped: the claims are gone, so are the leases
    assert not kube.api.objects_of("resourceclaims")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = request("GET", f"{pool.api}/allocations?user=alice", pool.spawner_token).json()
        if all(le["state"] == "released" for le in r["items"]):
            break
        time.sleep(0.2)
    assert all(le["state"] == "released" for le in r["items"])


def test_re_partitioning_a_gpu_the_driver_partitions_is_refused(db_url):
    from jupyterhub_gpupool.dbutil import upgrade
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.service.ingest import node_from_inventory
    from jupyterhub_gpupool.store.errors import StoreError
    from tests.fakes import StoreClock, make_store

    upgrade(db_url)
    pool = {
        "nodes": [
            {
                "name": NODE,
                "gpus": [
                    {"model": "A100-80GB", "uuid": A100, "mig": {"enabled": True}},
                    {"model": "A100-80GB", "uuid": A100_OFF},  # MIG off
                ],
            }
        ],
        "offers": [
            {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]}
        ],
        "quotas": {"default": {"guarantee": 0, "limit": 8}},
    }
    store = make_store(db_url, StoreClock(), pool, dra_dynamic_mig=[NODE])
    lease = store.allocate("alice", "", "a100-1g")
    assert lease.state == "granted" and lease.ready
    assert store.keepalive(lease.id).state == "active"  # nothing to wait for
    assert store.mig_plan(NODE) == ()
    # the scheduler put the claim's instance elsewhere than the pool planned, over the planned
    # place; the node's agent sees it busy: the grant is not given up (a claim makes instances)
    start = lease.slots[0].start
    busy = {"profile": "3g.40gb", "start": 0 if start < 4 else 4, "processes": 1}
    report = {
        "gpus": [
            {
                "uuid": A100,
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": {"enabled": True, "instances": [{**busy, "uuid": "MIG-elsewhere"}]},
            },
            {"uuid": A100_OFF, "index": 1, "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
        ]
    }
    store.put_inventory(node_from_inventory(NODE, report, default_catalog()), actor="agent")
    assert store.lease(lease.id).state == "active"
    assert store.events(kind="mig-failed")[0] == []
    with pytest.raises(StoreError) as info:
        store.request_repartition(NODE, A100, [{"profile": "7g.80gb", "start": 0}])
    assert info.value.code == "conflict"
    assert "made per claim by the NVIDIA DRA driver" in info.value.message
    # nor may mig-manager turn MIG on for another GPU of that node
    with pytest.raises(StoreError) as info:
        store.request_repartition(NODE, A100_OFF, [{"profile": "7g.80gb", "start": 0}])
    assert info.value.code == "conflict"
    # the same GPU without the setting is a static MIG GPU with no instance: the ask waits
    other = make_store(db_url, StoreClock(), pool)
    assert other.allocate("bob", "", "a100-1g").state == "queued"


def test_the_hubs_rights_for_dra_are_z2jhs_role_and_the_example(pool, kube):
    """The spawn goes to an API server that enforces RBAC: the hub's service account has
    z2jh's hub Role and the example's rules, and nothing is refused."""
    full, z2jh_only = kube.rules

    async def scenario():
        s = make_spawner(
            pool,
            kube,
            "carol",
            "a100-1g",
            namespace=HUB_NS,
            flat_network=True,  # the "other cluster" is this machine
            cluster_apis={"default": {"context": "rbac", "config_file": kube.config_file}},
        )
        await s.run_pre_spawn_hook()
        await s.start()
        claim = kube.rbac.objects_of("resourceclaims")[f"{HUB_NS}/{s.pod_name}-gpu"]
        out = claim, s.dra_devices
        await s.stop()
        return out

    claim, devices = run(scenario)
    assert dra.results(claim)[0]["device"].startswith("gpu-0-mig-1g10gb-19-")
    assert devices[0]["matches"]
    assert full.refused == []
    assert not kube.rbac.objects_of("resourceclaims")  # deleted with the server: allowed

    # z2jh's Role alone: every call of the DRA backend is refused (403), as the example says
    def call(method: str, path: str) -> int:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"{kube.bare.url}{path}", method=method)
        req.add_header("Authorization", f"Bearer {HUB_TOKEN}")
        req.add_header("Content-Type", "application/json")
        if method == "POST":
            req.data = json.dumps(claim_body).encode()
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    claim_body = {k: v for k, v in claim.items() if k != "status"}
    claim_body["metadata"] = {"name": "probe-gpu"}
    group = "/apis/resource.k8s.io/v1"
    refused = {
        ("GET", f"{group}/deviceclasses/gpu.nvidia.com"): call(
            "GET", f"{group}/deviceclasses/gpu.nvidia.com"
        ),
        ("GET", f"{group}/resourceslices"): call("GET", f"{group}/resourceslices"),
        ("POST", "claims"): call("POST", f"{group}/namespaces/{HUB_NS}/resourceclaims"),
        ("GET", "claim"): call("GET", f"{group}/namespaces/{HUB_NS}/resourceclaims/x"),
        ("DELETE", "claim"): call("DELETE", f"{group}/namespaces/{HUB_NS}/resourceclaims/x"),
    }
    assert set(refused.values()) == {403}
    assert {(r.verb, r.resource) for _, r in z2jh_only.refused} == {
        ("get", "deviceclasses"),
        ("list", "resourceslices"),
        ("create", "resourceclaims"),
        ("get", "resourceclaims"),
        ("delete", "resourceclaims"),
    }


def test_the_hub_rbac_example_is_valid_kubernetes():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    for doc in docs:
        for version in ("1.34", "1.35"):
            kubernetes_validate.validate(doc, desired_version=version, strict=True)


def test_a_re_partition_asked_before_the_node_was_declared_is_failed_not_labelled(db_url, tmp_path):
    """mig-manager must not run beside the driver: the labeller fails such a re-partition with
    the reason, and the node's labels are never patched."""
    from jupyterhub_gpupool.dbutil import upgrade
    from jupyterhub_gpupool.kube.labeller import MigLabeller
    from jupyterhub_gpupool.service.writer import BatchWriter
    from tests.fakes import StoreClock, make_store

    upgrade(db_url)
    seven = [{"profile": "1g.10gb", "start": s} for s in range(7)]
    gpu = {"model": "A100-80GB", "uuid": A100, "mig": {"enabled": True, "instances": seven}}
    pool = {
        "nodes": [{"name": NODE, "gpus": [gpu]}],
        "quotas": {"default": {"guarantee": 0, "limit": 8}},
    }
    store = make_store(db_url, StoreClock(), pool)  # not yet declared: a label re-partition
    rep = store.request_repartition(NODE, A100, [{"profile": "7g.80gb", "start": 0}])
    assert rep.state == "applying" and rep.method == "label"
    token = tmp_path / "token"
    with FakeKubeAPI([kube_node(NODE, config="all-1g.10gb")], token="t") as api:
        token.write_text("t\n")
        labeller = MigLabeller(
            enabled=True, api_host=api.url, token_file=str(token), dra_dynamic_mig=[NODE]
        )

        async def one_round():
            writer = BatchWriter(store)
            writer.start()
            try:
                return await labeller.step(store, writer.run)
            finally:
                writer.stop()
                await labeller.close()

        assert asyncio.run(one_round()) == {NODE: "failed"}
        assert api.patches == []
    (done,) = store.repartitions()
    assert done.state == "failed"
    assert "made per claim by the NVIDIA DRA driver" in done.error
