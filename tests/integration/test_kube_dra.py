"""``GPUPoolKubeSpawner`` with Dynamic Resource Allocation, against a real pool service and a
Kubernetes API server over real HTTP (``tests.fakes.FakeKubeAPI`` with
``tests.fakekube_dra.FakeDRA``: the NVIDIA driver's DeviceClasses and ResourceSlices, and an
allocator that evaluates the claims' CEL against the published devices).

Nothing is patched: the spawner finds DRA on its own (``device_backend = "auto"``), creates the
claim, the pod references it, the fake scheduler allocates it, the spawner reads the allocation
back and deletes the claim with the server. The GPUs of the pool and of the slices share their
uuids, as a real node's NVML and DRA driver do.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tests.fakekube_dra import NVIDIA_CLASSES, FakeDRA, nvidia_slice
from tests.fakekube_dra import run_spawners as run
from tests.fakes import FakeKubeAPI, HubEnv, kube_node, kubeconfig, request, write_pool

pytestmark = pytest.mark.e2e

kubespawner = pytest.importorskip("kubespawner.spawner")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from jupyterhub_gpupool.spawner import dra  # noqa: E402
from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner  # noqa: E402

NS = "default"
H100 = ["GPU-0d7a0000-0000-4000-8000-000000000001", "GPU-0d7a0000-0000-4000-8000-000000000002"]
A100 = "GPU-0d7a0000-0000-4000-8000-000000000003"
L4 = "GPU-0d7a0000-0000-4000-8000-000000000004"
MIGS = {
    0: "MIG-0d7a0000-0000-4000-8000-0000000000a0",
    1: "MIG-0d7a0000-0000-4000-8000-0000000000a1",
}
REMADE = {
    0: "MIG-0d7a0000-0000-4000-8000-0000000000b0",
    1: "MIG-0d7a0000-0000-4000-8000-0000000000b1",
}

POOL = f"""
nodes:
  - name: dra-h100
    gpus:
      - {{model: H100-80GB, uuid: {H100[0]}, sharing: exclusive}}
      - {{model: H100-80GB, uuid: {H100[1]}, sharing: exclusive}}
  - name: dra-a100
    gpus:
      - model: A100-80GB
        uuid: {A100}
        mig:
          enabled: true
          instances:
            - {{profile: 1g.10gb, start: 0, uuid: {MIGS[0]}}}
            - {{profile: 1g.10gb, start: 1, uuid: {MIGS[1]}}}
  - name: dra-l4
    gpus:
      - {{model: L4, uuid: {L4}, sharing: shared}}
offers:
  - {{name: h100, kind: gpu, count: 1, models: [H100-80GB]}}
  - {{name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}}
  - {{name: l4-quarter, kind: shared, fraction: 0.25, models: [L4]}}
  - {{name: l4-half, kind: shared, fraction: 0.5, models: [L4]}}
quotas:
  default: {{guarantee: 0.25, limit: 4}}
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    where = tmp_path_factory.mktemp("kubedra")
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


def slices(migs=MIGS):
    return [
        nvidia_slice("dra-h100", [{"uuid": u} for u in H100]),
        nvidia_slice(
            "dra-a100",
            [
                {
                    "uuid": A100,
                    "product": "NVIDIA A100-SXM4-80GB",
                    "mig": [{"profile": "1g.10gb", "start": s, "uuid": u} for s, u in migs.items()],
                }
            ],
        ),
        nvidia_slice("dra-l4", [{"uuid": L4, "product": "NVIDIA L4", "memory_gib": 24}]),
    ]


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    where = tmp_path_factory.mktemp("kubedraapi")
    nodes = [kube_node(n) for n in ("dra-h100", "dra-a100", "dra-l4")]
    api = FakeKubeAPI(nodes, token="dra-token", dra=FakeDRA(slices()))
    plain = FakeKubeAPI([kube_node("dra-h100")], token="plain-token")  # no DRA served
    bare = FakeKubeAPI(nodes, token="bare-token", dra=FakeDRA(slices(), classes={}))  # no driver
    # the node made its MIG instances again: same places, new uuids
    remade = FakeKubeAPI(nodes, token="remade-token", dra=FakeDRA(slices(REMADE)))
    # the driver with its MIG devices turned off: no DeviceClass mig.nvidia.com
    gpu_only = {"gpu.nvidia.com": NVIDIA_CLASSES["gpu.nvidia.com"]}
    nomig = FakeKubeAPI(nodes, token="nomig-token", dra=FakeDRA(slices(), classes=gpu_only))
    servers = {"dra": api, "plain": plain, "bare": bare, "remade": remade, "nomig": nomig}
    config_file = where / "kubeconfig"
    config_file.write_text(json.dumps(kubeconfig(servers, "dra")))
    with api, plain, bare, remade, nomig, pytest.MonkeyPatch.context() as mp:
        from kubernetes_asyncio.config import kube_config

        mp.setenv("KUBECONFIG", str(config_file))
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config_file))
        mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield SimpleNamespace(
            api=api,
            plain=plain,
            bare=bare,
            remade=remade,
            nomig=nomig,
            config_file=str(config_file),
        )


def make_spawner(pool, kube, user, offer, *, context=None, **traits) -> GPUPoolKubeSpawner:
    fake_user = SimpleNamespace(
        name=user, groups=[], settings={}, url=f"/user/{user}/", id=1, escaped_name=user
    )
    apis = {}
    if context:  # a lease's cluster is "default": reach another server through cluster_apis
        apis = {"default": {"context": context, "config_file": kube.config_file}}
    spawner = GPUPoolKubeSpawner(
        _mock=True,
        user=fake_user,
        pool_api_url=pool.api,
        pool_api_token=pool.spawner_token,
        queue_poll_interval=0.2,
        k8s_api_host=kube.api.url,
        flat_network=True,  # the test's "other cluster" is this machine
        cluster_apis=apis,
        **{"start_timeout": 60, "mem_limit": "4G", "cpu_guarantee": 0.5, **traits},
    )
    spawner.user_options = {"gpupool_offer": offer}
    return spawner


def claims(api) -> dict[str, dict]:
    return api.objects_of("resourceclaims")


def device_of(claim) -> str:
    (result,) = dra.results(claim)
    return result["device"]


def live(pool, user):
    r = request("GET", f"{pool.api}/allocations?user={user}", pool.spawner_token)
    return [le for le in r.json()["items"] if le["state"] != "released"]


def kube_call(method: str, url: str, token: str, body: object = None) -> int:
    """One call to the fake API server with its bearer token; the HTTP status."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def validate(obj):
    for version in ("1.34", "1.35"):
        kubernetes_validate.validate(obj, desired_version=version, strict=True)


def test_a_whole_gpu_pod_gets_a_claim_for_exactly_the_granted_gpu(pool, kube):
    async def scenario():
        a = make_spawner(pool, kube, "ada", "h100")
        b = make_spawner(pool, kube, "bob", "h100")
        await a.run_pre_spawn_hook()
        await b.run_pre_spawn_hook()
        await asyncio.gather(a.start(), b.start())
        seen = {
            s.user.name: (
                s.gpupool_lease,
                kube.api.objects_of("pods")[f"{NS}/{s.pod_name}"],
                claims(kube.api)[f"{NS}/{s.pod_name}-gpu"],
                s.dra_devices,
                s.get_state(),
            )
            for s in (a, b)
        }
        # the hub restarts: a spawner from the saved state deletes the claim with the server
        again = make_spawner(pool, kube, "ada", "h100")
        again.load_state(a.get_state())
        await asyncio.gather(again.stop(), b.stop())
        return seen, {a.pod_name, b.pod_name}

    seen, pods = run(scenario)
    granted = set()
    for lease, pod, claim, devices, state in seen.values():
        gpu = lease["slots"][0]["gpu"]
        granted.add(gpu)
        # the pod references its claim; the container keeps its memory limit and CPU request
        # and asks the device plugin for nothing
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": f"{pod['metadata']['name']}-gpu"}
        ]
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["claims"] == [{"name": "gpu"}]
        assert resources["limits"] == {"memory": 4 * 2**30}
        assert resources["requests"]["cpu"] == 0.5
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == "dra-h100"
        # the claim selects exactly the granted GPU, and got it
        expression = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
        assert expression["cel"]["expression"] == (
            f'device.attributes["gpu.nvidia.com"].uuid == "{gpu}"'
        )
        assert device_of(claim) == f"gpu-{H100.index(gpu)}"
        assert claim["status"]["reservedFor"][0]["name"] == pod["metadata"]["name"]
        validate({k: v for k, v in claim.items() if k != "status"})
        validate({k: v for k, v in pod.items() if k != "status"})
        # the spawner read back what was allocated, and keeps it across a hub restart
        assert devices == [
            {
                "slot": 0,
                "gpu": gpu,
                "mig_uuid": None,
                "profile": None,
                "start": None,
                "pool": "dra-h100",
                "device": f"gpu-{H100.index(gpu)}",
                "matches": True,
            }
        ]
        assert state["gpupool_dra"]["claim"] == f"{pod['metadata']['name']}-gpu"
    assert granted == set(H100)  # two servers, two GPUs, each where the pool put it
    # stopped: pods and claims gone, leases released
    assert not {f"{NS}/{p}" for p in pods} & set(kube.api.objects_of("pods"))
    assert not {f"{NS}/{p}-gpu" for p in pods} & set(claims(kube.api))
    assert live(pool, "ada") == live(pool, "bob") == []


def test_a_mig_slice_is_claimed_by_parent_profile_and_placement(pool, kube):
    async def scenario():
        s = make_spawner(pool, kube, "mia", "a100-1g")
        await s.run_pre_spawn_hook()
        await s.start()
        claim = claims(kube.api)[f"{NS}/{s.pod_name}-gpu"]
        out = s.gpupool_lease, claim, s.dra_devices
        await s.stop()
        return out

    lease, claim, devices = run(scenario)
    (slot,) = lease["slots"]
    assert slot["gpu"] == A100 and slot["profile"] == "1g.10gb"
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert (
        f'"memorySlice{slot["start"]}" in device.capacity'
        in exactly["selectors"][0]["cel"]["expression"]
    )
    assert device_of(claim) == f"gpu-0-mig-1g10gb-{slot['start']}"
    assert devices[0]["gpu"] == A100 and devices[0]["mig_uuid"] == MIGS[slot["start"]]
    assert devices[0]["matches"]


def test_a_device_held_by_another_claim_is_not_given(pool, kube):
    """A training job's claim holds the GPU the pool granted (the pool did not place it): the
    server's claim is not allocated to it, the pod stays Pending saying why, the failed start
    deletes the server's claim."""

    async def scenario():
        s = make_spawner(pool, kube, "tara", "h100", start_timeout=4)
        await s.run_pre_spawn_hook()
        gpu = s.gpupool_lease["slots"][0]["gpu"]
        job = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "training-job"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['gpu.nvidia.com']"
                                            f".uuid == '{gpu}'"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            },
        }
        base = f"{kube.api.url}/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
        token = kube.api.token
        assert kube_call("POST", base, token, job) == 201
        trainer = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer"},
            "spec": {
                "containers": [
                    {"name": "train", "image": "train", "resources": {"claims": [{"name": "g"}]}}
                ],
                "resourceClaims": [{"name": "g", "resourceClaimName": "training-job"}],
                "nodeSelector": {"kubernetes.io/hostname": "dra-h100"},
            },
        }
        pods_url = f"{kube.api.url}/api/v1/namespaces/{NS}/pods"
        assert kube_call("POST", pods_url, token, trainer) == 201
        try:
            with pytest.raises(Exception) as info:
                await s.start()
            pod = kube.api.objects_of("pods").get(f"{NS}/{s.pod_name}")
            after_failure = set(claims(kube.api))
            await s.stop()
            return gpu, info.value, pod, after_failure, s.pod_name
        finally:
            kube_call("DELETE", f"{pods_url}/trainer", token)
            kube_call("DELETE", f"{base}/training-job", token)

    gpu, error, pod, after_failure, pod_name = run(scenario)
    assert "did not start" in str(error) or isinstance(error, TimeoutError)
    assert pod["status"]["phase"] == "Pending"
    events = [
        e["message"]
        for e in kube.api.objects_of("events").values()
        if e["involvedObject"]["name"] == pod_name and e["reason"] == "FailedScheduling"
    ]
    assert any(
        f"device gpu-{H100.index(gpu)} is held by claim {NS}/training-job" in m for m in events
    ), events
    assert f"{NS}/{pod_name}-gpu" not in after_failure
    assert f"{NS}/training-job" in after_failure
    assert live(pool, "tara") == []


def test_shares_of_a_gpu_use_its_one_mps_claim_with_a_memory_limit_per_client(pool, kube):
    async def scenario():
        a = make_spawner(pool, kube, "sam", "l4-quarter")
        b = make_spawner(pool, kube, "sue", "l4-quarter")
        for s in (a, b):
            await s.run_pre_spawn_hook()
            await s.start()
        name = dra.shared_claim_name(L4)
        claim = claims(kube.api)[f"{NS}/{name}"]
        pods = [kube.api.objects_of("pods")[f"{NS}/{s.pod_name}"] for s in (a, b)]
        devices = (a.dra_devices, b.dra_devices)
        # a half share needs another memory limit than the claim's: refused while it is used
        c = make_spawner(pool, kube, "hal", "l4-half")
        await c.run_pre_spawn_hook()
        with pytest.raises(Exception) as refused:
            await c.start()
        await c.stop()
        await a.stop()
        kept = claims(kube.api)[f"{NS}/{name}"]
        await b.stop()
        after = claims(kube.api).get(f"{NS}/{name}")
        return claim, pods, refused.value, kept, after, devices

    claim, pods, refused, kept, after, devices = run(scenario)
    mps = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert mps["sharing"] == {
        "strategy": "MPS",
        "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "6144Mi"},  # a quarter of 24 GiB
    }
    assert device_of(claim) == "gpu-0"
    assert {r["name"] for r in claim["status"]["reservedFor"]} == {
        p["metadata"]["name"] for p in pods
    }
    for pod in pods:
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu-shared", "resourceClaimName": dra.shared_claim_name(L4)}
        ]
        assert pod["status"]["phase"] == "Running"
    assert all(d[0]["gpu"] == L4 and d[0]["matches"] for d in devices)
    assert "memory limit per client is 6144Mi" in str(refused)
    assert getattr(refused, "status_code", None) == 409
    # the pool's claim outlives its servers; unreserved, it is deallocated
    assert [r["name"] for r in kept["status"]["reservedFor"]] == [pods[1]["metadata"]["name"]]
    assert after is not None and "status" not in after
    assert live(pool, "hal") == []


@pytest.mark.parametrize(
    ("context", "why"), [("plain", "no resource.k8s.io/v1"), ("bare", "no DeviceClass")]
)
def test_auto_keeps_the_device_plugin_where_dra_is_not_there(pool, kube, context, why):
    server = getattr(kube, context)

    async def scenario():
        s = make_spawner(pool, kube, "otto", "h100", context=context)
        await s.run_pre_spawn_hook()
        await s.start()
        pod = server.objects_of("pods")[f"{NS}/{s.pod_name}"]
        state = s.get_state()
        await s.stop()
        return pod, state

    pod, state = run(scenario)
    assert "resourceClaims" not in pod["spec"], why
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": 4 * 2**30,
        "nvidia.com/gpu": "1",
    }
    assert "gpupool_dra" not in state
    assert claims(server) == {}


def test_dra_asked_for_where_there_is_none_fails_the_spawn_saying_so(pool, kube):
    async def scenario():
        s = make_spawner(pool, kube, "dora", "h100", context="plain", device_backend="dra")
        await s.run_pre_spawn_hook()
        with pytest.raises(Exception) as info:
            await s.start()
        await s.stop()
        return info.value

    error = run(scenario)
    assert "serves no ResourceClaims (resource.k8s.io/v1), but device_backend is 'dra'" in str(
        error
    )
    assert getattr(error, "status_code", None) == 503
    assert kube.plain.objects_of("pods") == {}
    assert live(pool, "dora") == []


def test_a_mig_slice_where_the_driver_has_no_mig_class_fails_saying_so(pool, kube):
    async def scenario():
        s = make_spawner(pool, kube, "nico", "a100-1g", context="nomig")
        await s.run_pre_spawn_hook()
        with pytest.raises(Exception) as info:
            await s.start()
        await s.stop()
        # a whole GPU on the same cluster is served by DRA all the same
        w = make_spawner(pool, kube, "nico", "h100", context="nomig")
        await w.run_pre_spawn_hook()
        await w.start()
        pod = kube.nomig.objects_of("pods")[f"{NS}/{w.pod_name}"]
        await w.stop()
        return info.value, pod

    error, pod = run(scenario)
    assert "has no DeviceClass mig.nvidia.com" in str(error)
    assert getattr(error, "status_code", None) == 503
    assert pod["spec"]["resourceClaims"][0]["name"] == "gpu"
    assert claims(kube.nomig) == {}
    assert live(pool, "nico") == []


def test_a_slice_made_again_is_still_claimed_at_its_place(pool, kube, caplog):
    """The node made its MIG instances again (new uuids, same places): the claim, by parent,
    profile and memory slice, still gets the granted instance; the spawner reads its new uuid,
    says so, and does not move the lease (the node's inventory reports instances)."""

    async def scenario():
        s = make_spawner(pool, kube, "remy", "a100-1g", context="remade")
        await s.run_pre_spawn_hook()
        await s.start()
        lease = request(
            "GET", f"{pool.api}/allocations/{s.gpupool_lease['id']}", pool.spawner_token
        )
        out = s.gpupool_lease, s.dra_devices, lease.json()
        await s.stop()
        return out

    caplog.set_level("INFO")
    granted, devices, after = run(scenario)
    start = granted["slots"][0]["start"]
    assert granted["slots"][0]["mig_uuid"] == MIGS[start]
    assert devices[0]["mig_uuid"] == REMADE[start] and devices[0]["start"] == start
    assert devices[0]["matches"]
    assert f"MIG instance {REMADE[start]} at the chosen place (the pool records {MIGS[start]}" in (
        caplog.text
    )
    assert "rebind" not in caplog.text and "recording its allocated" not in caplog.text
    assert after["slots"] == granted["slots"] and after["state"] == "active"
    assert live(pool, "remy") == []


def test_the_fake_api_server_checks_and_protects_claims_as_kubernetes_does(kube):
    """What the tests above lean on: invalid claims refused with 422 (schema, CEL), names
    unique (409), unknown ones 404, and a claim a pod uses outlives its deletion until the pod
    goes (the API server's finalizer)."""
    base = f"{kube.api.url}/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    token = kube.api.token

    def claim(name, expression):
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
                                "deviceClassName": "gpu.nvidia.com",
                                "selectors": [{"cel": {"expression": expression}}],
                            },
                        }
                    ]
                }
            },
        }

    uuid_is = f'device.attributes["gpu.nvidia.com"].uuid == "{H100[1]}"'
    assert kube_call("POST", base, token, claim("bad-cel", "device.attributes[")) == 422
    assert kube_call("POST", base, token, {**claim("no-spec", uuid_is), "spec": 1}) == 422
    assert kube_call("POST", base, token, claim("held", uuid_is)) == 201
    assert kube_call("POST", base, token, claim("held", uuid_is)) == 409
    assert kube_call("GET", f"{base}/nothing", token) == 404
    assert kube_call("GET", base, "wrong-token") == 401
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holder"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "g"}]}}],
            "resourceClaims": [{"name": "g", "resourceClaimName": "held"}],
        },
    }
    pods_url = f"{kube.api.url}/api/v1/namespaces/{NS}/pods"
    assert kube_call("POST", pods_url, token, pod) == 201
    held = claims(kube.api)[f"{NS}/held"]
    assert device_of(held) == "gpu-1" and held["status"]["reservedFor"][0]["name"] == "holder"
    assert kube_call("DELETE", f"{base}/held", token) == 200
    assert claims(kube.api)[f"{NS}/held"]["metadata"]["deletionTimestamp"]  # still there
    assert kube_call("DELETE", f"{pods_url}/holder", token) == 200
    assert f"{NS}/held" not in claims(kube.api)
    assert kube_call("GET", f"{kube.api.url}/apis/resource.k8s.io/v1", token) == 200
    assert kube_call("GET", f"{kube.plain.url}/apis/resource.k8s.io/v1", kube.plain.token) == 404
