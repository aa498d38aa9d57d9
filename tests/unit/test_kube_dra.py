"""DRA objects for a lease (``spawner/dra.py``), checked against literal dicts and validated
against the Kubernetes 1.34 and 1.35 schemas (``kubernetes-validate``, strict); the pod with
its claims is built by KubeSpawner's own ``make_pod``."""

from __future__ import annotations

import asyncio

import pytest

from jupyterhub_gpupool.spawner import dra
from jupyterhub_gpupool.spawner.objects import check_pod_manifest, pod_overrides
from tests.fakekube_dra import CelError, cel_eval, cel_view, nvidia_slice

K8S_VERSIONS = ("1.34", "1.35")
API_URL = "http://hub.example.org/services/gpupool/api/v1/"
H100 = "GPU-1f0e3c2a-0000-4000-8000-000000000001"
A100 = "GPU-1f0e3c2a-0000-4000-8000-000000000002"


def slot(kind, gpu, **kw):
    return {"gpu": gpu, "kind": kind, "profile": None, "start": None, "milli": 1000, **kw}


def lease(slots, offer="h100"):
    return {
        "id": "3f2a9c0d",
        "offer": offer,
        "state": "granted",
        "node": "gpu-node-1",
        "slots": slots,
    }


WHOLE = lease([slot("gpu", H100)])
TWO = lease([slot("gpu", H100), slot("gpu", A100)], offer="h100x2")
MIG = lease([slot("mig", A100, profile="1g.10gb", start=3, milli=0)], offer="a100-1g")
SHARE = lease([slot("shared", H100, milli=250)], offer="h100-quarter")


@pytest.fixture
def validate():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")

    def check(manifest):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(manifest, desired_version=version, strict=True)

    return check


def test_whole_gpu_claim_selects_the_uuid(validate):
    claim = dra.server_claim(WHOLE, name="jupyter-alice-gpu", namespace="jhub")
    assert claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "jupyter-alice-gpu",
            "namespace": "jhub",
            "labels": {
                "app.kubernetes.io/managed-by": "jupyterhub-gpupool",
                "gpupool.jupyter.org/lease": "3f2a9c0d",
                "gpupool.jupyter.org/offer": "h100",
            },
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu-0",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": 'device.attributes["gpu.nvidia.com"].uuid'
                                        f' == "{H100}"'
                                    }
                                }
                            ],
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ]
            }
        },
    }
    validate(claim)


def test_two_gpus_are_two_requests_each_pinned(validate):
    claim = dra.server_claim(TWO, name="c", namespace="jhub")
    requests = claim["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["gpu-0", "gpu-1"]
    assert [r["exactly"]["selectors"][0]["cel"]["expression"] for r in requests] == [
        f'device.attributes["gpu.nvidia.com"].uuid == "{H100}"',
        f'device.attributes["gpu.nvidia.com"].uuid == "{A100}"',
    ]
    validate(claim)


def test_mig_claim_names_parent_profile_and_placement(validate):
    claim = dra.server_claim(MIG, name="c", namespace="jhub")
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert exactly["selectors"][0]["cel"]["expression"] == (
        f'device.attributes["gpu.nvidia.com"].parentUUID == "{A100}"'
        ' && device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
        ' && "memorySlice3" in device.capacity["gpu.nvidia.com"]'
    )
    validate(claim)


def test_selectors_pick_exactly_the_device_on_the_drivers_slice():
    """The expressions, run by the fake API's evaluator against what the driver publishes:
    the class's selector and ours together match one device."""
    node = nvidia_slice(
        "n",
        [
            {"uuid": H100},
            {
                "uuid": A100,
                "mig": [{"profile": "1g.10gb", "start": s, "uuid": f"MIG-{s}"} for s in range(7)],
            },
        ],
    )
    views = [cel_view("gpu.nvidia.com", d) for d in node["spec"]["devices"]]
    for the_lease, classname, want in [
        (WHOLE, "gpu.nvidia.com", ["gpu-0"]),
        (MIG, "mig.nvidia.com", ["gpu-1-mig-1g10gb-3"]),
    ]:
        exactly = dra.server_claim(the_lease, name="c", namespace="x")["spec"]["devices"][
            "requests"
        ][0]["exactly"]
        from tests.fakekube_dra import NVIDIA_CLASSES

        got = [
            d["name"]
            for d, view in zip(node["spec"]["devices"], views, strict=True)
            if cel_eval(NVIDIA_CLASSES[classname], view)
            and cel_eval(exactly["selectors"][0]["cel"]["expression"], view)
        ]
        assert got == want


def test_values_that_are_not_uuids_are_refused_not_escaped():
    with pytest.raises(ValueError, match="cannot be put in a device selector"):
        dra.device_selector(slot("gpu", 'GPU-1" || true || "'))
    with pytest.raises(ValueError, match="memory slice"):
        dra.device_selector(slot("mig", A100, profile="1g.10gb", start=-1))


def test_a_share_has_no_server_claim_but_its_gpus_shared_claim(validate):
    assert dra.server_claim(SHARE, name="c", namespace="jhub") is None
    assert dra.claim_refs(SHARE, None) == {"gpu-shared": dra.shared_claim_name(H100)}
    claim = dra.shared_claim(H100, namespace="jhub", client_memory=20480)
    assert claim["metadata"]["name"] == "gpupool-share-gpu-1f0e3c2a-0000-4000-8000-000000000001"
    assert claim["metadata"]["annotations"] == {"gpupool.jupyter.org/mps-client-memory": "20480Mi"}
    assert claim["spec"]["devices"]["config"] == [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {
                        "strategy": "MPS",
                        "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "20480Mi"},
                    },
                },
            },
        }
    ]
    validate(claim)
    sliced = dra.shared_claim(H100, namespace="jhub", strategy="TimeSlicing")
    assert "config" not in sliced["spec"]["devices"]
    validate(sliced)
    with pytest.raises(ValueError, match="client memory"):
        dra.shared_claim(H100, namespace="jhub")


def test_client_memory_is_the_shares_fraction_rounded_down():
    assert dra.client_memory_mib(dra.quantity_bytes("80Gi"), 250) == 20480
    assert dra.client_memory_mib(dra.quantity_bytes("15360Mi"), 333) == 5114
    assert dra.quantity_bytes("85899345920") == 80 * 2**30
    assert dra.quantity_bytes("16G") == 16 * 10**9
    with pytest.raises(ValueError, match="under 1 MiB"):
        dra.client_memory_mib(2**20, 1)
    with pytest.raises(ValueError, match="not a quantity"):
        dra.quantity_bytes("80 GB")


def test_long_or_odd_gpu_ids_still_give_valid_claim_names():
    name = dra.shared_claim_name("GPU_" + "x" * 80)
    assert len(name) <= 63 and name.startswith("gpupool-share-gpu-x")
    assert dra.shared_claim_name("A") != dra.shared_claim_name("a_")
    assert dra.claim_name("jupyter-alice") == "jupyter-alice-gpu"


# -- the pod: KubeSpawner's make_pod, claims merged by our code --------------------------------


def _pod(overrides, **extra):
    objects = pytest.importorskip("kubespawner.objects")
    return objects.make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="quay.io/jupyter/pytorch-notebook:cuda12-latest",
        mem_limit="8G",
        mem_guarantee="2G",
        cpu_guarantee=0.5,
        node_selector=overrides["node_selector"],
        tolerations=overrides["tolerations"],
        labels={},
        annotations={},
        env={},
        extra_resource_limits={},
        extra_resource_guarantees={},
        **extra,
    )


def _serialize(pod):
    from kubernetes_asyncio.client import ApiClient

    async def run():
        async with ApiClient() as api:
            return api.sanitize_for_serialization(pod)

    return asyncio.run(run())


def test_claims_are_merged_into_the_container_keeping_its_limits(validate):
    from kubernetes_asyncio.client import CoreV1ResourceClaim, V1PodResourceClaim

    overrides = pod_overrides(WHOLE, api_url=API_URL)
    pod = _pod(overrides)
    # a claim of the admin's own (e.g. extra_pod_config) must survive ours
    pod.spec.resource_claims = [V1PodResourceClaim(name="scratch", resource_claim_name="s")]
    pod.spec.containers[0].resources.claims = [CoreV1ResourceClaim(name="scratch")]
    refs = dra.claim_refs(WHOLE, "jupyter-alice-gpu")
    dra.attach_claims(pod, refs)
    dra.attach_claims(pod, refs)  # twice: no doubles
    manifest = _serialize(pod)
    validate(manifest)
    check_pod_manifest(manifest)
    assert manifest["spec"]["resourceClaims"] == [
        {"name": "scratch", "resourceClaimName": "s"},
        {"name": "gpu", "resourceClaimName": "jupyter-alice-gpu"},
    ]
    resources = manifest["spec"]["containers"][0]["resources"]
    assert resources == {
        "claims": [{"name": "scratch"}, {"name": "gpu"}],
        "limits": {"memory": "8G"},
        "requests": {"cpu": 0.5, "memory": "2G"},
    }


def test_a_share_pod_references_its_gpus_claim(validate):
    pod = _pod(pod_overrides(SHARE, api_url=API_URL))
    dra.attach_claims(pod, dra.claim_refs(SHARE, None))
    manifest = _serialize(pod)
    validate(manifest)
    assert manifest["spec"]["resourceClaims"] == [
        {"name": "gpu-shared", "resourceClaimName": dra.shared_claim_name(H100)}
    ]


# -- reading the allocation back ----------------------------------------------------------------


def test_allocated_devices_read_uuids_from_the_slices():
    node = nvidia_slice(
        "gpu-node-1",
        [
            {"uuid": H100},
            {"uuid": A100, "mig": [{"profile": "1g.10gb", "start": 3, "uuid": "MIG-x"}]},
        ],
    )
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu-0",
                            "driver": "gpu.nvidia.com",
                            "pool": "gpu-node-1",
                            "device": "gpu-1-mig-1g10gb-3",
                        },
                        {"request": "other", "driver": "x.example.com", "pool": "p", "device": "d"},
                    ]
                }
            }
        }
    }
    got = dra.allocated_devices(claim, [node])
    assert got == [
        {
            "request": "gpu-0",
            "pool": "gpu-node-1",
            "device": "gpu-1-mig-1g10gb-3",
            "type": "mig",
            "uuid": "MIG-x",
            "parent_uuid": A100,
            "profile": "1g.10gb",
            "start": 3,
        }
    ]
    assert dra.lease_devices(MIG, got) == [
        {
            "slot": 0,
            "gpu": A100,
            "mig_uuid": "MIG-x",
            "profile": "1g.10gb",
            "start": 3,
            "pool": "gpu-node-1",
            "device": "gpu-1-mig-1g10gb-3",
            "matches": True,
        }
    ]
    # an allocation of another GPU, or another place on it, is told apart
    other = [{**got[0], "parent_uuid": H100}]
    assert dra.lease_devices(MIG, other)[0]["matches"] is False
    assert dra.lease_devices(MIG, [{**got[0], "start": 4}])[0]["matches"] is False
    assert dra.lease_devices(MIG, [])[0] == {
        "slot": 0,
        "gpu": None,
        "mig_uuid": None,
        "profile": None,
        "start": None,
        "matches": False,
    }
    assert dra.results({}) == []


def test_the_fake_evaluator_refuses_what_it_does_not_know():
    view = cel_view("gpu.nvidia.com", nvidia_slice("n", [{"uuid": H100}])["spec"]["devices"][0])
    with pytest.raises(CelError):
        cel_eval('device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU")', view)
    with pytest.raises(CelError, match="no such key"):
        cel_eval('device.attributes["gpu.nvidia.com"].parentUUID == "x"', view)
    # false && error is false, as in CEL
    assert not cel_eval(
        'device.attributes["gpu.nvidia.com"].type == "mig"'
        ' && device.attributes["gpu.nvidia.com"].parentUUID == "x"',
        view,
    )
    assert cel_eval("!(device.driver != 'gpu.nvidia.com') || false", view)


def test_a_lease_is_rebound_only_to_a_device_other_than_the_chosen_one():
    same = dra.lease_devices(
        TWO,
        [
            {"request": "gpu-0", "type": "gpu", "uuid": H100},
            {"request": "gpu-1", "type": "gpu", "uuid": A100},
        ],
    )
    assert dra.rebind_ids(same) is None
    swapped = dra.lease_devices(
        TWO,
        [
            {"request": "gpu-0", "type": "gpu", "uuid": A100},
            {"request": "gpu-1", "type": "gpu", "uuid": H100},
        ],
    )
    assert dra.rebind_ids(swapped) == [A100, H100]
    # a MIG instance made again at the chosen place: a new uuid, no move
    remade = {"request": "gpu-0", "type": "mig", "uuid": "MIG-new", "parent_uuid": A100}
    remade.update(profile="1g.10gb", start=3)
    assert dra.rebind_ids(dra.lease_devices(MIG, [remade])) is None
    moved = {**remade, "start": 4}
    assert dra.rebind_ids(dra.lease_devices(MIG, [moved])) == ["MIG-new"]
    # a slot whose device is not known is not rebound by halves
    assert dra.rebind_ids(dra.lease_devices(TWO, [])) is None


def test_a_lease_with_fallback_devices_asks_first_available_granted_first(validate):
    other = "GPU-1f0e3c2a-0000-4000-8000-000000000009"
    alt_mig = {"gpu": A100, "kind": "mig", "profile": "1g.10gb", "start": 5}
    whole = {**TWO, "fallback": [{"gpu": other, "kind": "gpu", "profile": None, "start": None}]}
    claim = dra.server_claim(whole, name="c", namespace="jhub")
    requests = claim["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["gpu-0", "gpu-1"]
    for r, granted in zip(requests, (H100, A100), strict=True):
        subs = r["firstAvailable"]
        assert [s["name"] for s in subs] == ["granted", "fallback-0"]
        uuids = [s["selectors"][0]["cel"]["expression"].split('"')[-2] for s in subs]
        assert uuids == [granted, other]
        assert all(s["deviceClassName"] == "gpu.nvidia.com" and s["count"] == 1 for s in subs)
    validate(claim)
    mig = dra.server_claim({**MIG, "fallback": [alt_mig]}, name="c", namespace="jhub")
    subs = mig["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert subs[1]["selectors"][0]["cel"]["expression"].endswith(
        '"memorySlice5" in device.capacity["gpu.nvidia.com"]'
    )
    validate(mig)
    # the result names the subrequest; the slot is still the request's
    got = [
        {
            "request": "gpu-0/fallback-0",
            "type": "mig",
            "parent_uuid": A100,
            "profile": "1g.10gb",
            "start": 5,
            "uuid": "MIG-5",
        }
    ]
    (device,) = dra.lease_devices(MIG, got)
    assert device["gpu"] == A100 and device["start"] == 5 and device["matches"] is False
    assert dra.rebind_ids([device]) == ["MIG-5"]
    with pytest.raises(ValueError, match="not a mig device"):
        dra.server_claim({**MIG, "fallback": [whole["fallback"][0]]}, name="c", namespace="j")
    assert "firstAvailable" not in str(dra.server_claim(WHOLE, name="c", namespace="jhub"))
