"""Pod fragments for a lease (``spawner/objects.py``), checked against literal dicts.

Like KubeSpawner's own ``make_pod`` tests: every function's output is written out in full. The
last tests feed the fragments to KubeSpawner (``make_pod`` and a whole ``get_pod_manifest``) and
validate the pod against the Kubernetes JSON schemas (``kubernetes-validate``, strict).
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from traitlets import TraitError

from jupyterhub_gpupool.spawner import objects
from jupyterhub_gpupool.spawner.objects import (
    check_lease,
    check_pod_manifest,
    cpu_only_overrides,
    device_resource,
    label_value,
    mig_resource_name,
    pod_overrides,
    strip_gpu_resources,
)

API_URL = "http://hub.example.org/services/gpupool/api/v1/"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# z2jh's scheduling.userPods.tolerations: an admin's, which must survive
USER_TOLERATION = {
    "key": "hub.jupyter.org/dedicated",
    "operator": "Equal",
    "value": "user",
    "effect": "NoSchedule",
}
K8S_VERSIONS = ("1.30", "1.35")


def gpu_slot(uuid):
    return {
        "gpu": uuid,
        "kind": "gpu",
        "profile": None,
        "start": None,
        "milli": 1000,
        "mig_uuid": None,
    }


def mig_slot(profile, uuid="MIG-0c7e", start=0):
    return {
        "gpu": "GPU-6b7c",
        "kind": "mig",
        "profile": profile,
        "start": start,
        "milli": 0,
        "mig_uuid": uuid,
    }


def lease(slots, *, offer="a100-1g", node="gpu-node-3", lease_id="3f2a9c0d"):
    return {
        "id": lease_id,
        "user": "alice",
        "server": "",
        "offer": offer,
        "state": "granted",
        "ready": True,
        "node": node,
        "model": "A100-80GB",
        "units": 0.142857,
        "slots": slots,
    }


GPU1 = lease([gpu_slot("GPU-aaaa")], offer="h100")
GPU4 = lease([gpu_slot(f"GPU-{i}") for i in "abcd"], offer="h100x4", node="gpu-node-1")
MIG = lease([mig_slot("1g.10gb")])
MIG_ME = lease([mig_slot("1g.10gb+me")], offer="a100-1g-me")
SHARED = lease(
    [
        {
            "gpu": "GPU-eeee",
            "kind": "shared",
            "profile": None,
            "start": None,
            "milli": 250,
            "mig_uuid": None,
        }
    ],
    offer="shared-small",
)


def refusal(fn, *args, **kwargs):
    """The message of the ``ValueError`` that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --- device_resource -------------------------------------------------------------------------


def test_device_resource_one_whole_gpu():
    assert device_resource(GPU1) == {"nvidia.com/gpu": "1"}


def test_device_resource_four_whole_gpus():
    assert device_resource(GPU4) == {"nvidia.com/gpu": "4"}
    # whole GPUs do not depend on the MIG strategy
    assert device_resource(GPU4, mig_strategy="single") == {"nvidia.com/gpu": "4"}
    assert device_resource(GPU4, mig_strategy="none") == {"nvidia.com/gpu": "4"}


def test_device_resource_mig_mixed():
    assert device_resource(MIG) == {"nvidia.com/mig-1g.10gb": "1"}
    assert device_resource(MIG, mig_strategy="mixed") == {"nvidia.com/mig-1g.10gb": "1"}


def test_device_resource_mig_single():
    assert device_resource(MIG, mig_strategy="single") == {"nvidia.com/gpu": "1"}


def test_device_resource_mig_media_extensions():
    assert device_resource(MIG_ME) == {"nvidia.com/mig-1g.10gb.me": "1"}


def test_device_resource_counts_mig_slices_per_profile():
    two = lease([mig_slot("3g.40gb"), mig_slot("1g.10gb", "MIG-2", 4), mig_slot("1g.10gb")])
    assert device_resource(two) == {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}
    assert device_resource(two, mig_strategy="single") == {"nvidia.com/gpu": "3"}


def test_device_resource_mig_names_can_be_mapped():
    names = {"1g.10gb": "nvidia.com/mig-small"}
    assert device_resource(MIG, mig_resource_names=names) == {"nvidia.com/mig-small": "1"}
    assert device_resource(MIG_ME, mig_resource_names=names) == {"nvidia.com/mig-1g.10gb.me": "1"}


def test_device_resource_shared():
    assert device_resource(SHARED) == {"nvidia.com/gpu.shared": "1"}
    assert device_resource(SHARED, shared_resource="nvidia.com/gpu-ts") == {
        "nvidia.com/gpu-ts": "1"
    }


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("1g.5gb", "nvidia.com/mig-1g.5gb"),
        ("1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("3g.40gb", "nvidia.com/mig-3g.40gb"),
        ("7g.80gb", "nvidia.com/mig-7g.80gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("1g.24gb+me.all", "nvidia.com/mig-1g.24gb.me.all"),
        ("1g.24gb-me", "nvidia.com/mig-1g.24gb-me"),
        ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx"),
    ],
)
def test_mig_resource_name(profile, resource):
    assert mig_resource_name(profile) == resource


@pytest.mark.parametrize("profile", ["1G.10GB", "1g.10gb+me,gfx", "1g 10gb", "1g.10gb" + "x" * 60])
def test_mig_resource_name_refuses_what_is_no_resource_name(profile):
    assert refusal(mig_resource_name, profile) == (
        f"MIG profile {profile!r} gives no valid resource name "
        f"({'nvidia.com/mig-' + profile.replace('+', '.')!r})"
    )


def test_device_resource_refuses_what_the_device_plugin_cannot_give():
    assert refusal(device_resource, MIG, mig_strategy="none") == (
        "lease 3f2a9c0d holds MIG slices, but with mig_strategy 'none' the device plugin "
        "advertises no MIG devices"
    )
    assert refusal(device_resource, MIG, mig_strategy="Mixed") == (
        "mig_strategy must be one of none, single, mixed, not 'Mixed'"
    )
    assert refusal(device_resource, SHARED, shared_resource="gpu shared") == (
        "shared_resource 'gpu shared' is not a resource name"
    )
    assert refusal(device_resource, MIG, mig_resource_names={"1g.10gb": "small"}) == (
        "mig_resource_names['1g.10gb'] 'small' is not a resource name"
    )


def test_the_spawner_refuses_an_unknown_mig_strategy_when_configured():
    kube = pytest.importorskip("jupyterhub_gpupool.spawner.kube")
    trait = kube.GPUPoolKubeSpawner.class_traits()["mig_strategy"]
    assert (trait.default_value, tuple(trait.values)) == ("mixed", objects.MIG_STRATEGIES)
    with pytest.raises(TraitError, match="expected any of"):
        trait.validate(None, "Mixed")


def _broken(**changes):
    bad = copy.deepcopy(MIG)
    for key, value in changes.items():
        if value is None:
            del bad[key]
        else:
            bad[key] = value
    return bad


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "a lease is a JSON object, not list"),
        (_broken(id=""), "lease has no id"),
        (_broken(slots=None), "lease 3f2a9c0d has no slots"),
        (_broken(slots=[]), "lease 3f2a9c0d has no slots"),
        (_broken(node=None), "lease 3f2a9c0d has no node"),
        (_broken(offer=""), "lease 3f2a9c0d has no offer"),
        (_broken(state="queued"), "lease 3f2a9c0d is queued: it holds no device"),
        (_broken(slots=["GPU-1"]), "lease 3f2a9c0d: slot 0 is not an object"),
        (
            _broken(slots=[{**mig_slot("1g.10gb"), "kind": "vgpu"}]),
            "lease 3f2a9c0d: slot 0 has unknown kind 'vgpu' (one of gpu, mig, shared)",
        ),
        (
            _broken(slots=[{**mig_slot("1g.10gb"), "profile": None}]),
            "lease 3f2a9c0d: MIG slot 0 has no profile",
        ),
        (
            _broken(slots=[mig_slot("1g.10gb"), gpu_slot("GPU-b")]),
            "lease 3f2a9c0d mixes slot kinds ['gpu', 'mig']",
        ),
    ],
)
def test_bad_leases_are_refused(bad, message):
    assert refusal(check_lease, bad) == message
    assert refusal(device_resource, bad) == message
    assert refusal(pod_overrides, bad, api_url=API_URL) == message


def test_check_lease_returns_the_kind():
    assert [check_lease(x) for x in (GPU1, GPU4, MIG, MIG_ME, SHARED)] == [
        "gpu",
        "gpu",
        "mig",
        "mig",
        "shared",
    ]


# --- strip_gpu_resources ---------------------------------------------------------------------


def test_strip_gpu_resources():
    limits = {
        "memory": "8G",
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": "1",
        "amd.com/gpu": "1",
        "gpu.intel.com/i915": "1",
        "ephemeral-storage": "10Gi",
    }
    guarantees = {"nvidia.com/gpu": "1", "cpu": "500m", "nvidia.com/gpu.shared": "1"}
    assert strip_gpu_resources(limits, guarantees) == (
        {"memory": "8G", "ephemeral-storage": "10Gi"},
        {"cpu": "500m"},
    )
    assert limits["nvidia.com/gpu"] == 1  # inputs untouched
    assert strip_gpu_resources(None, None) == ({}, {})
    assert strip_gpu_resources(limits, {}, prefixes=("amd.com/",)) == (
        {
            "memory": "8G",
            "nvidia.com/gpu": 1,
            "nvidia.com/mig-1g.10gb": "1",
            "gpu.intel.com/i915": "1",
            "ephemeral-storage": "10Gi",
        },
        {},
    )


# --- label_value -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("a100-1g", "a100-1g"),
        ("3f2a9c0d-1b2c-4d5e-8f90-a1b2c3d4e5f6", "3f2a9c0d-1b2c-4d5e-8f90-a1b2c3d4e5f6"),
        ("", ""),
        ("x" * 63, "x" * 63),
        ("A100 · 1g.10gb", "A100-1g.10gb-495241b5"),
        ("x" * 70, "x" * 54 + "-c71bd109"),
        ("---", "cb3f91d5"),
        ("-a-", "a-a75a468f"),
        ("ab_", "ab-31acfee1"),
    ],
)
def test_label_value(value, label):
    assert label_value(value) == label
    assert len(label) <= 63


# --- pod_overrides ---------------------------------------------------------------------------


def test_pod_overrides_one_whole_gpu():
    assert pod_overrides(GPU1, api_url=API_URL) == {
        "extra_resource_limits": {"nvidia.com/gpu": "1"},
        "extra_resource_guarantees": {},
        "node_selector": {"kubernetes.io/hostname": "gpu-node-3"},
        "node_affinity_required": [],
        "tolerations": [TOLERATION],
        "extra_labels": {
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "h100",
        },
        "extra_annotations": {
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "h100",
            "gpupool.jupyter.org/node": "gpu-node-3",
            "gpupool.jupyter.org/slots": '[{{"gpu":"GPU-aaaa","kind":"gpu","mig_uuid":null,'
            '"milli":1000,"profile":null,"start":null}}]',
        },
        "environment": {
            "GPUPOOL_LEASE_ID": "3f2a9c0d",
            "GPUPOOL_OFFER": "h100",
            "GPUPOOL_API_URL": API_URL,
        },
    }


def test_pod_overrides_four_gpus_merge_with_what_is_configured():
    current = {
        "extra_resource_limits": {"memory": "64G", "nvidia.com/gpu": 1},
        # the KubeSpawner docstring's way: a GPU in guarantees only
        "extra_resource_guarantees": {"nvidia.com/gpu": "1", "ephemeral-storage": "1Gi"},
        "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "node_affinity_required": [],
        "tolerations": [USER_TOLERATION],
        "extra_labels": {"team": "ml"},
        "extra_annotations": {"owner": "{username}"},
        "environment": {"FOO": "bar", "CUDA_VISIBLE_DEVICES": "0"},
    }
    before = copy.deepcopy(current)
    assert pod_overrides(GPU4, api_url=API_URL, current=current) == {
        "extra_resource_limits": {"memory": "64G", "nvidia.com/gpu": "4"},
        "extra_resource_guarantees": {"ephemeral-storage": "1Gi"},
        "node_selector": {
            "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
            "kubernetes.io/hostname": "gpu-node-1",
        },
        "node_affinity_required": [],
        "tolerations": [
            USER_TOLERATION,
            TOLERATION,
        ],
        "extra_labels": {
            "team": "ml",
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "h100x4",
        },
        "extra_annotations": {
            "owner": "{username}",
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "h100x4",
            "gpupool.jupyter.org/node": "gpu-node-1",
            "gpupool.jupyter.org/slots": "["
            + ",".join(
                f'{{{{"gpu":"GPU-{i}","kind":"gpu","mig_uuid":null,"milli":1000,'
                f'"profile":null,"start":null}}}}'
                for i in "abcd"
            )
            + "]",
        },
        "environment": {
            "FOO": "bar",
            "GPUPOOL_LEASE_ID": "3f2a9c0d",
            "GPUPOOL_OFFER": "h100x4",
            "GPUPOOL_API_URL": API_URL,
        },
    }
    assert current == before  # never mutated


def test_pod_overrides_mig_mixed_with_offer():
    offer = {
        "name": "a100-1g",
        "kind": "mig",
        "profile": "1g.10gb",
        "display_name": "A100 · 1g.10gb slice",
        "models": ["A100-80GB"],
    }
    assert pod_overrides(MIG, api_url=API_URL, offer=offer) == {
        "extra_resource_limits": {"nvidia.com/mig-1g.10gb": "1"},
        "extra_resource_guarantees": {},
        "node_selector": {"kubernetes.io/hostname": "gpu-node-3"},
        "node_affinity_required": [],
        "tolerations": [TOLERATION],
        "extra_labels": {
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "a100-1g",
        },
        "extra_annotations": {
            "gpupool.jupyter.org/lease": "3f2a9c0d",
            "gpupool.jupyter.org/offer": "a100-1g",
            "gpupool.jupyter.org/node": "gpu-node-3",
            "gpupool.jupyter.org/slots": '[{{"gpu":"GPU-6b7c","kind":"mig","mig_uuid":"MIG-0c7e",'
            '"milli":0,"profile":"1g.10gb","start":0}}]',
            "gpupool.jupyter.org/offer-display-name": "A100 · 1g.10gb slice",
        },
        "environment": {
            "GPUPOOL_LEASE_ID": "3f2a9c0d",
            "GPUPOOL_OFFER": "a100-1g",
            "GPUPOOL_API_URL": API_URL,
        },
    }


def test_pod_overrides_mig_single_and_media_extensions():
    assert pod_overrides(MIG, api_url=API_URL, mig_strategy="single")["extra_resource_limits"] == {
        "nvidia.com/gpu": "1"
    }
    assert pod_overrides(MIG_ME, api_url=API_URL)["extra_resource_limits"] == {
        "nvidia.com/mig-1g.10gb.me": "1"
    }


def test_pod_overrides_shared():
    out = pod_overrides(SHARED, api_url=API_URL, current={"extra_resource_limits": {"cpu": "2"}})
    assert out["extra_resource_limits"] == {"cpu": "2", "nvidia.com/gpu.shared": "1"}
    assert out["extra_resource_guarantees"] == {}
    assert out["extra_labels"] == {
        "gpupool.jupyter.org/lease": "3f2a9c0d",
        "gpupool.jupyter.org/offer": "shared-small",
    }


def test_a_custom_shared_resource_counts_as_a_gpu():
    current = {"extra_resource_limits": {"example.com/gpu-slice": "1", "cpu": "1"}}
    out = pod_overrides(
        SHARED, api_url=API_URL, current=current, shared_resource="example.com/gpu-slice"
    )
    assert out["extra_resource_limits"] == {"cpu": "1", "example.com/gpu-slice": "1"}
    out = cpu_only_overrides(current=out, shared_resource="example.com/gpu-slice")
    assert out["extra_resource_limits"] == {"cpu": "1"}


def test_pod_overrides_pins_by_node_name_in_every_affinity_term():
    # z2jh's scheduling.userPods.nodeAffinity.matchNodePurpose=require adds this term; terms
    # are ORed, so the node name must join each term rather than become a term of its own
    purpose = {
        "matchExpressions": [
            {"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}
        ]
    }
    by_name = {"key": "metadata.name", "operator": "In", "values": ["gpu-node-3"]}
    current = {"node_affinity_required": [purpose], "node_selector": {"disk": "ssd"}}
    out = pod_overrides(MIG, api_url=API_URL, current=current, node_label=None)
    assert out["node_selector"] == {"disk": "ssd"}
    assert out["node_affinity_required"] == [{**purpose, "matchFields": [by_name]}]
    assert current["node_affinity_required"] == [purpose]
    # without terms, one term of its own
    assert pod_overrides(MIG, api_url=API_URL, node_label=None)["node_affinity_required"] == [
        {"matchFields": [by_name]}
    ]
    # the dict form KubeSpawner also accepts
    out = pod_overrides(
        MIG, api_url=API_URL, current={"node_affinity_required": {"b": purpose}}, node_label=None
    )
    assert out["node_affinity_required"] == [{**purpose, "matchFields": [by_name]}]


def test_pod_overrides_custom_node_label_and_tolerations():
    taint = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    out = pod_overrides(
        GPU1, api_url=API_URL, node_label="example.org/node", gpu_tolerations=[taint]
    )
    assert out["node_selector"] == {"example.org/node": "gpu-node-3"}
    assert out["tolerations"] == [taint]
    assert pod_overrides(GPU1, api_url=API_URL, gpu_tolerations=())["tolerations"] == []


def test_pod_overrides_tolerations_in_dict_form():
    admin = {"key": "hub.jupyter.org/dedicated", "operator": "Exists"}
    out = pod_overrides(GPU1, api_url=API_URL, current={"tolerations": {"01-user": admin}})
    assert out["tolerations"] == {"01-user": admin, "gpupool-0": TOLERATION}


def test_pod_overrides_of_a_second_lease_leave_nothing_of_the_first():
    first = pod_overrides(GPU4, api_url=API_URL, current={"extra_resource_limits": {"cpu": "4"}})
    second = pod_overrides(MIG, api_url=API_URL, current=first)
    assert second == pod_overrides(
        MIG, api_url=API_URL, current={"extra_resource_limits": {"cpu": "4"}}
    )
    by_name = pod_overrides(GPU4, api_url=API_URL, node_label=None)
    again = pod_overrides(MIG, api_url=API_URL, current=by_name, node_label=None)
    assert again["node_affinity_required"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-3"]}]}
    ]


def test_pod_overrides_refuses_another_offer():
    assert refusal(pod_overrides, MIG, api_url=API_URL, offer={"name": "h100"}) == (
        "offer 'h100' is not the lease's offer 'a100-1g'"
    )


def test_pod_overrides_sanitises_labels_but_annotates_the_originals():
    odd = lease([mig_slot("1g.10gb")], offer="A100 · 1g.10gb", lease_id="x" * 70)
    out = pod_overrides(odd, api_url=API_URL)
    assert out["extra_labels"] == {
        "gpupool.jupyter.org/lease": "x" * 54 + "-c71bd109",
        "gpupool.jupyter.org/offer": "A100-1g.10gb-495241b5",
    }
    assert out["extra_annotations"]["gpupool.jupyter.org/lease"] == "x" * 70
    assert out["extra_annotations"]["gpupool.jupyter.org/offer"] == "A100 · 1g.10gb"
    assert out["environment"]["GPUPOOL_OFFER"] == "A100 · 1g.10gb"


def test_values_survive_kubespawner_template_expansion():
    # KubeSpawner runs str.format over labels, annotations and environment values
    braces = lease([mig_slot("1g.10gb", uuid="MIG-{x}")], offer="a{b}")
    out = pod_overrides(
        braces, api_url="http://h/{p}/", offer={"name": "a{b}", "display_name": "{n}"}
    )
    annotations = {k: v.format(username="alice") for k, v in out["extra_annotations"].items()}
    assert json.loads(annotations["gpupool.jupyter.org/slots"]) == braces["slots"]
    assert annotations["gpupool.jupyter.org/offer-display-name"] == "{n}"
    assert out["environment"]["GPUPOOL_API_URL"].format() == "http://h/{p}/"
    assert out["environment"]["GPUPOOL_OFFER"].format() == "a{b}"


# --- cpu_only_overrides ----------------------------------------------------------------------


def test_cpu_only_after_a_gpu_removes_the_stale_override():
    base = {
        "extra_resource_limits": {"memory": "8G"},
        "node_selector": {"hub.jupyter.org/node-purpose": "user"},
        "tolerations": [USER_TOLERATION],
        "extra_labels": {"team": "ml"},
        "extra_annotations": {"owner": "alice"},
        "environment": {"FOO": "bar"},
    }
    after_gpu = pod_overrides(GPU1, api_url=API_URL, current=base)
    assert cpu_only_overrides(current=after_gpu, api_url=API_URL) == {
        "extra_resource_limits": {"memory": "8G"},
        "extra_resource_guarantees": {},
        "node_selector": {"hub.jupyter.org/node-purpose": "user"},
        "node_affinity_required": [],
        "tolerations": [USER_TOLERATION],
        "extra_labels": {"team": "ml"},
        "extra_annotations": {"owner": "alice"},
        "environment": {"FOO": "bar", "GPUPOOL_API_URL": API_URL, "NVIDIA_VISIBLE_DEVICES": "void"},
    }


def test_cpu_only_drops_a_gpu_from_a_profile_override():
    # the kubespawner#546 profile: its kubespawner_override merged into the spawner's traits
    profile_gpu = {
        "extra_resource_limits": {"nvidia.com/gpu": "1", "memory": "40G"},
        "extra_resource_guarantees": {"nvidia.com/gpu": "1", "memory": "40G"},
        "node_selector": {"company.com/gpu": "true"},
        "tolerations": [{"effect": "NoSchedule", "key": "gpu_only", "value": "true"}, TOLERATION],
    }
    assert cpu_only_overrides(current=profile_gpu) == {
        "extra_resource_limits": {"memory": "40G"},
        "extra_resource_guarantees": {"memory": "40G"},
        "node_selector": {"company.com/gpu": "true"},
        "node_affinity_required": [],
        "tolerations": [{"effect": "NoSchedule", "key": "gpu_only", "value": "true"}],
        "extra_labels": {},
        "extra_annotations": {},
        "environment": {"NVIDIA_VISIBLE_DEVICES": "void"},
    }


def test_cpu_only_without_hiding_gpus_and_after_a_pin_by_name():
    after = pod_overrides(MIG, api_url=API_URL, node_label=None)
    assert cpu_only_overrides(current=after, hide_gpus=False) == {
        "extra_resource_limits": {},
        "extra_resource_guarantees": {},
        "node_selector": {},
        "node_affinity_required": [],
        "tolerations": [],
        "extra_labels": {},
        "extra_annotations": {},
        "environment": {"GPUPOOL_API_URL": API_URL},  # not the lease's: the lab still uses it
    }


def test_overridden_traits_are_what_the_functions_return():
    assert tuple(pod_overrides(MIG, api_url=API_URL)) == objects.OVERRIDDEN_TRAITS
    assert tuple(cpu_only_overrides()) == objects.OVERRIDDEN_TRAITS


# --- check_pod_manifest ----------------------------------------------------------------------


def _pod(resources, labels=None):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "jupyter-alice", "labels": labels or {}},
        "spec": {"containers": [{"name": "notebook", "image": "x", "resources": resources}]},
    }


def test_check_pod_manifest():
    check_pod_manifest(_pod({"limits": {"nvidia.com/gpu": "2", "memory": "1G"}}))
    check_pod_manifest(_pod({"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": "1"}}))
    check_pod_manifest(_pod({"requests": {"cpu": "0.5"}}, labels={"a.b/c": "d-1"}))
    gpu_request = _pod({"requests": {"nvidia.com/gpu": "1"}})
    assert refusal(check_pod_manifest, gpu_request) == (
        "container notebook: nvidia.com/gpu is requested but has no limit"
    )
    unequal = _pod({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}})
    assert refusal(check_pod_manifest, unequal) == (
        "container notebook: nvidia.com/gpu request '1' != limit '2'"
    )
    half = _pod({"limits": {"nvidia.com/gpu.shared": "0.5"}})
    assert refusal(check_pod_manifest, half) == (
        "container notebook: nvidia.com/gpu.shared limit '0.5' is not a whole number"
    )
    labels = _pod({}, labels={"gpupool.jupyter.org/offer": "A100 · 1g", "bad key": "x"})
    assert refusal(check_pod_manifest, labels) == (
        "label gpupool.jupyter.org/offer='A100 · 1g' is not a valid label value; "
        "label key 'bad key' is not valid"
    )


# --- through KubeSpawner, validated against the Kubernetes schemas ---------------------------


@pytest.fixture
def k8s():
    """``(make_pod, serialize, validate)``; skipped where the kubernetes extra is missing."""
    kubespawner_objects = pytest.importorskip("kubespawner.objects")
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_asyncio.client import ApiClient

    async def _serialize(pod):
        async with ApiClient() as api:  # its HTTP pool wants a running loop
            return api.sanitize_for_serialization(pod)

    def serialize(pod):
        return asyncio.run(_serialize(pod))

    def validate(manifest):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(manifest, desired_version=version, strict=True)

    return kubespawner_objects.make_pod, serialize, validate


def _expand(values):
    """What KubeSpawner's ``_expand_all`` does to values without placeholders."""
    return {k: v.format() if isinstance(v, str) else v for k, v in values.items()}


def _make_pod(make_pod, ov):
    return make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="quay.io/jupyter/pytorch-notebook:cuda12-latest",
        mem_limit="8G",
        cpu_guarantee=0.5,
        node_selector=ov["node_selector"],
        tolerations=ov["tolerations"],
        node_affinity_required=ov["node_affinity_required"],
        labels=_expand(ov["extra_labels"]),
        annotations=_expand(ov["extra_annotations"]),
        env=_expand(ov["environment"]),
        extra_resource_limits=ov["extra_resource_limits"],
        extra_resource_guarantees=ov["extra_resource_guarantees"],
    )


CASES = {
    "gpu1": (GPU1, {}, {"nvidia.com/gpu": "1"}),
    "gpu4": (GPU4, {}, {"nvidia.com/gpu": "4"}),
    "mig-mixed": (MIG, {}, {"nvidia.com/mig-1g.10gb": "1"}),
    "mig-single": (MIG, {"mig_strategy": "single"}, {"nvidia.com/gpu": "1"}),
    "mig-me": (MIG_ME, {}, {"nvidia.com/mig-1g.10gb.me": "1"}),
    "shared": (SHARED, {}, {"nvidia.com/gpu.shared": "1"}),
    "by-node-name": (MIG, {"node_label": None}, {"nvidia.com/mig-1g.10gb": "1"}),
}


@pytest.mark.parametrize("case", CASES)
def test_make_pod_manifest_is_valid(k8s, case):
    make_pod, serialize, validate = k8s
    the_lease, kwargs, device = CASES[case]
    current = {"extra_resource_guarantees": {"nvidia.com/gpu": "1"}}  # must not survive
    ov = pod_overrides(the_lease, api_url=API_URL, current=current, **kwargs)
    manifest = serialize(_make_pod(make_pod, ov))
    validate(manifest)
    check_pod_manifest(manifest)
    resources = manifest["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "8G", **device}, "requests": {"cpu": 0.5}}
    assert manifest["spec"]["tolerations"] == [TOLERATION]
    if kwargs.get("node_label", "") is None:
        assert "nodeSelector" not in manifest["spec"]
        assert manifest["spec"]["affinity"] == {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [the_lease["node"]],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    else:
        assert manifest["spec"]["nodeSelector"] == {"kubernetes.io/hostname": the_lease["node"]}
    annotations = manifest["metadata"]["annotations"]
    assert json.loads(annotations["gpupool.jupyter.org/slots"]) == the_lease["slots"]
    env = {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}
    assert env == {
        "GPUPOOL_LEASE_ID": "3f2a9c0d",
        "GPUPOOL_OFFER": the_lease["offer"],
        "GPUPOOL_API_URL": API_URL,
    }


def test_make_pod_manifest_cpu_only_is_valid(k8s):
    make_pod, serialize, validate = k8s
    after_gpu = pod_overrides(
        GPU4, api_url=API_URL, current={"extra_resource_limits": {"cpu": "2"}}
    )
    manifest = serialize(
        _make_pod(make_pod, cpu_only_overrides(current=after_gpu, api_url=API_URL))
    )
    validate(manifest)
    check_pod_manifest(manifest)
    spec = manifest["spec"]
    assert spec["containers"][0]["resources"] == {
        "limits": {"cpu": "2", "memory": "8G"},
        "requests": {"cpu": 0.5},
    }
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert "annotations" not in manifest["metadata"] or manifest["metadata"]["annotations"] == {}
    assert {e["name"]: e["value"] for e in spec["containers"][0]["env"]} == {
        "GPUPOOL_API_URL": API_URL,
        "NVIDIA_VISIBLE_DEVICES": "void",
    }


def test_gpu_only_in_requests_passes_the_schema_but_not_our_check(k8s):
    # the KubeSpawner docstring's example (`extra_resource_guarantees` alone) makes a pod the
    # schema accepts and the API server refuses; ours puts the GPU in limits
    make_pod, serialize, validate = k8s
    manifest = serialize(
        make_pod(
            name="jupyter-alice",
            cmd=None,
            port=8888,
            image="x",
            extra_resource_guarantees={"nvidia.com/gpu": "1"},
        )
    )
    validate(manifest)
    assert refusal(check_pod_manifest, manifest) == (
        "container notebook: nvidia.com/gpu is requested but has no limit"
    )
    ours = serialize(_make_pod(make_pod, pod_overrides(GPU1, api_url=API_URL)))
    assert ours["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in ours["spec"]["containers"][0]["resources"]["requests"]


def test_kubespawner_get_pod_manifest_with_the_overrides(k8s, monkeypatch):
    """The real consumer: traits set on a KubeSpawner, its own template expansion included."""
    _, serialize, validate = k8s
    import kubespawner.spawner

    # no cluster: skip loading a kube config and creating the API client
    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kw: None)
    monkeypatch.setattr(kubespawner.spawner, "shared_client", lambda name: None)
    spawner = kubespawner.spawner.KubeSpawner(_mock=True)
    spawner.extra_resource_guarantees = {"nvidia.com/gpu": "1"}
    spawner.extra_annotations = {"owner": "{unescaped_username}"}
    current = {name: getattr(spawner, name) for name in objects.OVERRIDDEN_TRAITS}
    offer = {"name": "a100-1g", "display_name": "A100 {1g} slice"}
    for name, value in pod_overrides(MIG, api_url=API_URL, current=current, offer=offer).items():
        setattr(spawner, name, value)

    manifest = serialize(asyncio.run(spawner.get_pod_manifest()))
    validate(manifest)
    check_pod_manifest(manifest)
    annotations = manifest["metadata"]["annotations"]
    assert annotations["owner"] == "mock@name"
    assert json.loads(annotations["gpupool.jupyter.org/slots"]) == MIG["slots"]
    assert annotations["gpupool.jupyter.org/offer-display-name"] == "A100 {1g} slice"
    assert manifest["metadata"]["labels"]["gpupool.jupyter.org/lease"] == "3f2a9c0d"
    container = manifest["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}, "requests": {}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPOOL_LEASE_ID"] == "3f2a9c0d"
    assert env["GPUPOOL_API_URL"] == API_URL
    assert "NVIDIA_VISIBLE_DEVICES" not in env


def test_runtime_class_on_gpu_pods_only():
    given = {"priorityClassName": "users"}
    gpu = objects.with_runtime_class(given, "nvidia", gpu=True)
    assert gpu == {"priorityClassName": "users", "runtimeClassName": "nvidia"}
    assert given == {"priorityClassName": "users"}  # not mutated
    # the next spawn of the same spawner is CPU-only: the class it added goes
    assert objects.with_runtime_class(gpu, "nvidia", gpu=False) == {"priorityClassName": "users"}
    # a class the admin set for every pod stays on CPU pods, and yields to the GPU class
    kata = {"runtimeClassName": "kata"}
    assert objects.with_runtime_class(kata, "nvidia", gpu=False) == kata
    assert objects.with_runtime_class(kata, "nvidia", gpu=True) == {"runtimeClassName": "nvidia"}
    # no class configured: nothing changes
    assert objects.with_runtime_class(kata, "", gpu=True) == kata
    assert objects.with_runtime_class({}, "", gpu=False) == {}
