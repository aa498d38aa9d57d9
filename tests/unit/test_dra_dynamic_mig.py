"""Dynamic MIG through NVIDIA's DRA driver: partitionable devices (KEP-4815) and their claims.

The fake publishes what the driver does with ``DynamicMIG`` (a counter set per GPU, abstract
MIG devices consuming memory-slice counters, ``tests.fakekube_dra.nvidia_partitioned_slices``)
and allocates as Kubernetes does: a device whose counters are spent is not allocatable. The
spawner's pure side claims such a slice by parent and profile (CEL cannot see counters) and
reads its placement back from the counters it consumes.
"""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.spawner import dra
from tests.fakekube_dra import FakeDRA, nvidia_partitioned_slices, nvidia_slice

A100 = "GPU-0d7a0000-0000-4000-8000-00000000d1a0"
OTHER = "GPU-0d7a0000-0000-4000-8000-00000000d1a1"
STATIC = "GPU-0d7a0000-0000-4000-8000-00000000d1a2"
NODE = "dyn-a100"
LEASE = {
    "id": "lease-1",
    "offer": "a100-1g",
    "node": NODE,
    "slots": [{"gpu": A100, "kind": "mig", "profile": "1g.10gb", "start": 3, "milli": 0}],
}


def published(gpus=(A100,)):
    return nvidia_partitioned_slices(NODE, [{"uuid": u, "model": "A100-80GB"} for u in gpus])


class Cluster:
    """A FakeDRA's allocator over a plain object table (the fake API server's, without HTTP)."""

    def __init__(self, slices) -> None:
        self.dra = FakeDRA(slices, validate_version=None)
        self.objects: dict = {}
        self.dra.install(self)
        self.n = 0

    def claim(self, device_class: str, expression: str) -> tuple[dict, str | None]:
        self.n += 1
        claim = {
            "metadata": {"name": f"c{self.n}", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu-0",
                            "exactly": {
                                "deviceClassName": device_class,
                                "selectors": [{"cel": {"expression": expression}}],
                            },
                        }
                    ]
                }
            },
        }
        self.objects[("resourceclaims", "ns", f"c{self.n}")] = claim
        reason = self.dra._allocate_claim(self, claim, NODE)
        if reason is not None:
            del self.objects[("resourceclaims", "ns", f"c{self.n}")]
        return claim, reason

    def mig(self, profile: str, gpu: str = A100) -> tuple[dict, str | None]:
        return self.claim(
            *dra.device_selector({"kind": "mig", "gpu": gpu, "profile": profile}, placed=False)
        )


def device_name(claim: dict) -> str:
    (result,) = dra.results(claim)
    return result["device"]


def test_the_published_devices_are_partitions_of_each_gpu():
    counters, devices = published()
    assert "devices" not in counters["spec"] and "sharedCounters" not in devices["spec"]
    (counter_set,) = counters["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0-counter-set"
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counter_set["counters"])
    names = [d["name"] for d in devices["spec"]["devices"]]
    # the full GPU, then 1g.10gb (profile id 19) at each of its seven starts, as the driver names
    assert names[0] == "gpu-0"
    assert [n for n in names if n.startswith("gpu-0-mig-1g10gb-19-")] == [
        f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)
    ]
    found = dra.slice_devices([counters, devices])
    one = found[(NODE, "gpu-0-mig-1g10gb-19-3")]
    # no uuid before the claim makes it, no memorySlice capacity: placement is in the counters
    assert "uuid" not in one["attributes"] and one["attributes"]["parentUUID"] == A100
    assert not [c for c in one["capacity"] if c.startswith("memorySlice")]
    assert dra.memory_slices(one) == [3]
    assert dra.memory_slices(found[(NODE, "gpu-0-mig-3g40gb-9-4")]) == [4, 5, 6, 7]


def test_partitioned_gpus_are_those_whose_mig_devices_consume_counters():
    slices = [
        *published(),
        nvidia_slice(
            "static",
            [{"uuid": STATIC, "mig": [{"profile": "1g.10gb", "start": 0, "uuid": "MIG-x"}]}],
        ),
    ]
    assert dra.partitioned_gpus(slices, [A100, STATIC, OTHER]) == {A100}


def test_the_claim_of_a_partitioned_gpu_names_parent_and_profile_only():
    claim = dra.server_claim(LEASE, name="p-gpu", namespace="ns", partitioned=[A100])
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert request["exactly"]["selectors"][0]["cel"]["expression"] == (
        f'device.attributes["gpu.nvidia.com"].parentUUID == "{A100}" && '
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    )
    # a static MIG GPU keeps its placement in the selector
    static = dra.server_claim(LEASE, name="p-gpu", namespace="ns")
    assert (
        '"memorySlice3" in device.capacity'
        in (
            static["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        )
    )
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in ("1.34", "1.35"):
        kubernetes_validate.validate(claim, desired_version=version, strict=True)


def test_the_published_slices_validate_against_kubernetes_1_35():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for s in published():
        kubernetes_validate.validate(
            {**s, "metadata": {**s["metadata"]}}, desired_version="1.35", strict=True
        )


def test_a_partition_is_allocatable_only_while_its_counters_remain():
    k = Cluster(published([A100, OTHER]))
    got = []
    for _ in range(7):
        claim, reason = k.mig("1g.10gb")
        assert reason is None
        got.append(device_name(claim))
    # seven 1g.10gb on seven distinct memory slices of the parent, then none: slices spent
    assert sorted(got) == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    _, reason = k.mig("1g.10gb")
    assert "matches no free device" in reason
    # the whole GPU consumes every counter: not while any partition is held
    _, reason = k.claim(*dra.device_selector({"kind": "gpu", "gpu": A100}))
    assert reason is not None
    # the other GPU is untouched: its own counter set. Two 3g.40gb fill its memory slices
    first, reason = k.mig("3g.40gb", OTHER)
    assert reason is None
    second, reason = k.mig("3g.40gb", OTHER)
    assert reason is None
    assert [device_name(first), device_name(second)] == [
        "gpu-1-mig-3g40gb-9-0",
        "gpu-1-mig-3g40gb-9-4",
    ]
    _, reason = k.mig("1g.10gb", OTHER)
    assert reason is not None


def test_allocation_freed_gives_the_counters_back():
    k = Cluster(published())
    whole, reason = k.claim(*dra.device_selector({"kind": "gpu", "gpu": A100}))
    assert reason is None and device_name(whole) == "gpu-0"
    _, reason = k.mig("1g.10gb")
    assert reason is not None
    whole.pop("status")  # the claim's pods went: deallocated
    claim, reason = k.mig("1g.10gb")
    assert reason is None and device_name(claim) == "gpu-0-mig-1g10gb-19-0"


def test_what_the_claim_got_is_read_back_with_its_placement():
    k = Cluster(published())
    claim, _ = k.mig("1g.10gb")
    allocated = dra.allocated_devices(claim, k.dra.initial_slices)
    assert allocated == [
        {
            "request": "gpu-0",
            "pool": NODE,
            "device": "gpu-0-mig-1g10gb-19-0",
            "type": "mig",
            "uuid": None,
            "parent_uuid": A100,
            "profile": "1g.10gb",
            "start": 0,
        }
    ]
    # the pool planned start 3; the scheduler chose 0: on a partitioned GPU that is the
    # scheduler's to choose, and still the granted profile on the granted parent
    (got,) = dra.lease_devices(LEASE, allocated, partitioned=[A100])
    assert got["matches"] and got["gpu"] == A100 and got["start"] == 0
    (strict,) = dra.lease_devices(LEASE, allocated)
    assert not strict["matches"]
