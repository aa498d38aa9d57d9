"""Shares only where the node serves them (``pool.sharing``, ``kube.nodes.advertises_shares``).

With the device plugin, a share is a time-slicing replica that exists only on a node whose
plugin advertises it; such a node advertises no whole ``nvidia.com/gpu`` (``renameByDefault``).
So the node's advertisement sets its GPUs' modes, and a share no node offers is refused with
words the user can act on.
"""

from __future__ import annotations

import copy

import pytest

from jupyterhub_gpupool.kube import nodes as kn
from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Rejected
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import Gpu, MigInstance, Node, Request, parse_offer
from jupyterhub_gpupool.pool.sharing import (
    advertised_modes,
    changed_modes,
    only_exclusive,
    reported_mode,
)
from tests.fakes import kube_node

CATALOG = default_catalog()
L4 = CATALOG.model("L4")
A100 = CATALOG.model("A100-80GB")
SHARE = parse_offer({"name": "l4-q", "kind": "shared", "fraction": 0.25}, CATALOG)
WHOLE = parse_offer({"name": "l4", "kind": "gpu", "models": ["L4"]}, CATALOG)


def node(name: str, sharing: str, n: int = 2, mig: bool = False) -> Node:
    gpus = [Gpu(f"GPU-{name}-{i}", i, L4, sharing=sharing) for i in range(n)]
    if mig:
        gpus.append(
            Gpu(f"GPU-{name}-mig", n, A100, mig_enabled=True, instances=[MigInstance("7g.80gb", 0)])
        )
    return Node(name, gpus=gpus)


def ask(alloc: Allocator, offer: str, user: str = "u") -> object:
    return alloc.submit(Request(f"r-{user}-{offer}", user, offer), now=0.0)


# -- the pure rules ---------------------------------------------------------------------------


def test_a_node_that_advertises_makes_its_plain_gpus_shared_and_leaves_mig_alone():
    n = node("a", "exclusive", mig=True)
    assert advertised_modes(n, True) == {"GPU-a-0": "shared", "GPU-a-1": "shared"}
    assert advertised_modes(n, False) == {"GPU-a-0": "exclusive", "GPU-a-1": "exclusive"}
    # only what differs is written
    assert changed_modes(n, advertised_modes(n, False)) == {}
    assert changed_modes(n, advertised_modes(n, True)) == {
        "GPU-a-0": "shared",
        "GPU-a-1": "shared",
    }


@pytest.mark.parametrize(
    ("reported", "known", "after"),
    [
        ("auto", "shared", "shared"),  # an agent cannot see the plugin's config
        ("auto", "exclusive", "exclusive"),
        ("auto", None, "auto"),  # a GPU new to the pool
        ("exclusive", "shared", "exclusive"),  # a mode an agent does report is taken
    ],
)
def test_an_agents_auto_keeps_the_mode_the_pool_learnt(reported, known, after):
    assert reported_mode(reported, known) == after


def test_only_exclusive_needs_gpus_and_all_of_them_exclusive():
    assert only_exclusive(["exclusive", "exclusive"])
    assert not only_exclusive(["exclusive", "shared"])
    assert not only_exclusive(["auto"])
    assert not only_exclusive([])  # no plain GPU at all: another refusal (no such hardware)


# -- the node's facts -------------------------------------------------------------------------


def time_sliced(replicas: int = 4, *, rename: bool = True) -> dict:
    """A node after the device plugin's time-slicing config (GFD's labels, its resources)."""
    n = kube_node("ts", product="NVIDIA-L4", gpus=2)
    n["metadata"]["labels"][kn.SHARING_STRATEGY] = "time-slicing"
    n["metadata"]["labels"][kn.REPLICAS] = str(replicas)
    for where in ("capacity", "allocatable"):
        res = n["status"][where]
        res.pop("nvidia.com/gpu", None)
        res[kn.SHARED_RESOURCE if rename else "nvidia.com/gpu"] = str(2 * replicas)
    return n


def test_the_node_advertises_shares_by_its_replicas_or_gfds_labels():
    plain = kube_node("plain", product="NVIDIA-L4", gpus=2)
    assert plain["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert not kn.advertises_shares(plain)
    assert kn.advertises_shares(time_sliced())
    # without renameByDefault the replicas keep the name nvidia.com/gpu: GFD's labels say it
    assert kn.advertises_shares(time_sliced(rename=False))
    labels_only = copy.deepcopy(plain)
    labels_only["metadata"]["labels"].update({kn.SHARING_STRATEGY: "mps", kn.REPLICAS: "2"})
    assert kn.advertises_shares(labels_only)
    # GFD's labels on a node that shares nothing
    none = copy.deepcopy(plain)
    none["metadata"]["labels"].update({kn.SHARING_STRATEGY: "none", kn.REPLICAS: "1"})
    assert not kn.advertises_shares(none)
    one = copy.deepcopy(plain)
    one["metadata"]["labels"].update({kn.SHARING_STRATEGY: "time-slicing", kn.REPLICAS: "1"})
    assert not kn.advertises_shares(one)


# -- placement and the user's refusal ---------------------------------------------------------


def test_a_share_goes_only_to_the_node_that_offers_shares():
    alloc = Allocator([node("plain", "exclusive"), node("sliced", "shared")], [SHARE, WHOLE])
    share = ask(alloc, "l4-q")
    assert isinstance(share, Grant) and share.node == "sliced"
    whole = ask(alloc, "l4", "v")
    assert isinstance(whole, Grant) and whole.node == "plain"


def test_no_node_offering_shares_is_refused_saying_so_until_one_does():
    alloc = Allocator([node("plain", "exclusive"), node("other", "exclusive")], [SHARE, WHOLE])
    refused = ask(alloc, "l4-q")
    assert isinstance(refused, Rejected) and refused.code == "no_such_hardware"
    assert refused.message.startswith(
        "no node in the pool offers shared GPUs (time-slicing) for offer 'l4-q'"
    )
    assert "nvidia.com/gpu.sharing-strategy=time-slicing" in refused.message
    # the node's plugin starts time-slicing: the refusal (cached per inventory) is lifted
    for uuid in advertised_modes(alloc.nodes["other"], True):
        alloc.set_gpu_sharing(uuid, "shared")
    share = ask(alloc, "l4-q")
    assert isinstance(share, Grant) and share.node == "other"
    # and the node takes no whole GPU any more (the plugin advertises none there)
    wholes = [ask(alloc, "l4", user) for user in ("v", "w", "x")]
    assert [getattr(d, "node", None) for d in wholes] == ["plain", "plain", None]
    assert wholes[2].kind == "queued"


def test_hardware_that_is_simply_absent_keeps_its_own_refusal():
    alloc = Allocator([node("mig-only", "exclusive", n=0, mig=True)], [SHARE])
    refused = ask(alloc, "l4-q")
    assert isinstance(refused, Rejected) and refused.code == "no_such_hardware"
    assert refused.message == "no GPU in the pool can serve offer 'l4-q'"
