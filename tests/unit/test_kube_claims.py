"""Which devices ResourceClaims the pool did not make hold (``kube.claims``), on literal
ResourceSlices and claims as the NVIDIA DRA driver and the scheduler write them."""

from __future__ import annotations

from jupyterhub_gpupool.kube import claims as kc
from tests.fakekube_dra import nvidia_partitioned_slices, nvidia_slice

H0, H1, A0 = "GPU-h0", "GPU-h1", "GPU-a0"


def claim(name: str, device: str, pool: str, labels: dict | None = None, pods=()) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": labels or {}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": pool,
                            "device": device,
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in pods],
        },
    }


def slices() -> list[dict]:
    return [
        nvidia_slice("h", [{"uuid": H0}, {"uuid": H1}]),
        nvidia_slice(
            "m",
            [
                {
                    "uuid": A0,
                    "mig": [{"profile": "1g.10gb", "start": s, "uuid": f"M{s}"} for s in (0, 1)],
                }
            ],
        ),
    ]


NODES = {
    "h": [kc.PoolGpu(H0, False), kc.PoolGpu(H1, False)],
    "m": [kc.PoolGpu(A0, True, (0, 1))],
}


def test_claims_of_others_hold_their_exact_devices_the_pools_own_do_not():
    claims = [
        claim("train", "gpu-1", "h", pods=["train-0"]),
        claim("mine", "gpu-0", "h", {kc.LEASE_LABEL: "live-lease"}),
        claim("share", "gpu-0", "h", {kc.SHARED_GPU_LABEL: H0}),
        claim("left", "gpu-1-mig-1g10gb-1", "m", {kc.LEASE_LABEL: "ended-lease"}),
        {"metadata": {"name": "pending", "namespace": "ml"}},  # not allocated: holds nothing
    ]
    held = kc.outside_devices(slices(), claims, NODES, ["live-lease"])
    # the MIG device's name in the slice is gpu-0-mig-..., so "left" names no published device
    assert held == {"h": [(H1, None, "ml/train (pod train-0)")], "m": []}
    claims[3] = claim("left", "gpu-0-mig-1g10gb-1", "m", {kc.LEASE_LABEL: "ended-lease"})
    held = kc.outside_devices(slices(), claims, NODES, ["live-lease"])
    assert held["m"] == [(A0, 1, "ml/left")]  # a lease that ended: its claim is outside now


def test_devices_the_driver_does_not_publish_are_held_outside():
    only = [nvidia_slice("h", [{"uuid": H0}])]
    held = kc.outside_devices(only, [], NODES, [])
    assert held["h"] == [(H1, None, kc.UNPUBLISHED)]
    assert held["m"] == [(A0, 0, kc.UNPUBLISHED), (A0, 1, kc.UNPUBLISHED)]


def test_dynamic_mig_devices_are_placed_by_the_counters_they_consume():
    dynamic = nvidia_partitioned_slices("m", [{"uuid": A0, "model": "A100-80GB"}])
    devices = kc.published(dynamic)
    places = {(d.gpu, d.start) for d in devices.values() if d.node == "m"}
    assert (A0, 0) in places and (A0, 1) in places
    name = next(k for k, d in devices.items() if d.start == 1 and "1g" in k[1])
    held = kc.outside_devices(dynamic, [claim("infer", name[1], name[0])], NODES, [])
    assert (A0, 1, "ml/infer") in held["m"]
