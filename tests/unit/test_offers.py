"""Offer declarations (``parse_offer``) and the allocator's up-front refusals.

Every bad input is a ``ConfigError`` naming the offending field and, where the set is closed,
the allowed values (the offers contract; errors.py).
"""

from __future__ import annotations

from dataclasses import asdict
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Rejected
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import (
    ConfigError,
    MigLayoutError,
    UnknownModel,
    UnknownProfile,
)
from jupyterhub_gpupool.pool.model import (
    OFFER_KINDS,
    Gpu,
    MigInstance,
    Node,
    Offer,
    Request,
    offer_units,
    parse_offer,
)

CATALOG = default_catalog()


def bad(raw):
    """Parse ``raw`` expecting a ConfigError; return it."""
    with pytest.raises(ConfigError) as info:
        parse_offer(raw, CATALOG)
    return info.value


# ---------------------------------------------------------------------------------------------
# MIG offers


@pytest.mark.parametrize("profile", ["1g.5gb", "5g.50gb", "1g.10gb+gfx", "7g.40gb", ""])
def test_unknown_mig_profile_for_the_model(profile):
    err = bad({"name": "x", "kind": "mig", "profile": profile, "models": ["A100-80GB"]})
    assert isinstance(err, UnknownProfile)
    assert err.field == "profile"
    assert err.allowed == list(CATALOG.model("A100-80GB").profiles)
    assert "1g.10gb" in err.allowed


def test_profile_must_exist_on_every_listed_model():
    # 1g.10gb exists on A100-80GB and H100-80GB, not on H100 NVL
    parse_offer(
        {"name": "x", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB", "H100-80GB"]},
        CATALOG,
    )
    err = bad(
        {
            "name": "x",
            "kind": "mig",
            "profile": "1g.10gb",
            "models": ["A100-80GB", "NVIDIA H100 NVL"],
        }
    )
    assert isinstance(err, UnknownProfile)
    assert err.allowed == list(CATALOG.model("H100-NVL-94GB").profiles)


@pytest.mark.parametrize("model", ["T4", "Tesla T4", "G2", "V100-32GB"])
def test_mig_offer_on_gpu_without_mig(model):
    err = bad({"name": "x", "kind": "mig", "profile": "1g.10gb", "models": [model]})
    assert err.field == "models"
    assert CATALOG.model(model).name in str(err)
    # the error points at the models that can do MIG
    assert "A100-80GB" in err.allowed and CATALOG.model(model).name not in err.allowed


def test_mig_offer_without_models():
    err = bad({"name": "x", "kind": "mig", "profile": "1g.10gb"})
    assert err.field == "models"
    assert {"A100-80GB", "H100-80GB", "A30-24GB"} <= set(err.allowed)
    assert "T4" not in err.allowed
    assert bad({"name": "x", "kind": "mig", "profile": "1g.10gb", "models": []}).field == "models"


def test_mig_offer_without_profile():
    err = bad({"name": "x", "kind": "mig", "models": ["A100-80GB"]})
    assert err.field == "profile"


@pytest.mark.parametrize("count", [2, 0])
def test_mig_offer_is_one_slice(count):
    err = bad(
        {"name": "x", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"], "count": count}
    )
    assert err.field == "count"


# ---------------------------------------------------------------------------------------------
# Kinds, fields, types


@pytest.mark.parametrize("kind", ["tpu", "GPU", None, 3, ""])
def test_unknown_kind(kind):
    err = bad({"name": "x", "kind": kind})
    assert err.field == "kind"
    assert err.allowed == list(OFFER_KINDS)
    assert set(err.allowed) == {"gpu", "mig", "shared", "cpu"}


def test_missing_kind():
    assert bad({"name": "x"}).field == "kind"


@pytest.mark.parametrize("name", [None, "", 7])
def test_name_is_required(name):
    raw = {"kind": "gpu"} if name is None else {"name": name, "kind": "gpu"}
    assert bad(raw).field == "name"


def test_offer_must_be_a_mapping():
    assert bad(["name", "x"]).field == "offer"


@pytest.mark.parametrize("extra", [{"colour": "red"}, {"gpus": 2}, {"Profile": "1g.10gb"}])
def test_unknown_fields(extra):
    err = bad({"name": "x", "kind": "gpu", **extra})
    assert err.field == "offer"
    (key,) = extra
    assert key in str(err)
    assert {"name", "kind", "count", "profile", "models", "fraction"} <= set(err.allowed)
    assert key not in err.allowed


@pytest.mark.parametrize("count", [0, -1, "two", 1.5, True, None, "1"])
def test_bad_count(count):
    err = bad({"name": "x", "kind": "gpu", "count": count})
    assert err.field == "count"


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.25, "x", None, True])
def test_bad_fraction(fraction):
    err = bad({"name": "x", "kind": "shared", "fraction": fraction})
    assert err.field == "fraction"


def test_shared_offer_needs_fraction():
    assert bad({"name": "x", "kind": "shared"}).field == "fraction"


def test_shared_offer_is_one_share():
    err = bad({"name": "x", "kind": "shared", "fraction": 0.5, "count": 2})
    assert err.field == "count"


@pytest.mark.parametrize("value", [-1, -0.5, "10", None])
def test_bad_min_memory_gb(value):
    err = bad({"name": "x", "kind": "shared", "fraction": 0.5, "min_memory_gb": value})
    assert err.field == "min_memory_gb"


@pytest.mark.parametrize("key", ["cpu_milli", "memory_mib"])
def test_negative_resources(key):
    assert bad({"name": "x", "kind": "gpu", key: -1}).field == key


@pytest.mark.parametrize("kind", ["gpu", "mig", "cpu"])
def test_fraction_only_on_shared_offers(kind):
    raw = {"name": "x", "kind": kind, "fraction": 0.5}
    if kind == "mig":
        raw |= {"profile": "1g.10gb", "models": ["A100-80GB"]}
    assert bad(raw).field == "fraction"


@pytest.mark.parametrize("kind", ["shared", "gpu", "cpu"])
def test_profile_only_on_mig_offers(kind):
    raw = {"name": "x", "kind": kind, "profile": "1g.10gb"}
    if kind == "shared":
        raw["fraction"] = 0.5
    assert bad(raw).field == "profile"


@pytest.mark.parametrize("models", ["A100-80GB", ["A100-80GB", 3], [None]])
def test_models_must_be_a_list_of_names(models):
    assert bad({"name": "x", "kind": "gpu", "models": models}).field == "models"


@pytest.mark.parametrize("key,value", [("models", None), ("models", 5), ("groups", None)])
def test_non_list_models_or_groups_are_config_errors(key, value):
    assert bad({"name": "x", "kind": "gpu", key: value}).field == key


@pytest.mark.parametrize(
    "key,raw",
    [
        ("count", {"name": "x", "kind": "gpu", "count": float("nan")}),
        ("min_memory_gb", {"name": "x", "kind": "gpu", "min_memory_gb": float("nan")}),
    ],
)
def test_nan_is_a_config_error(key, raw):
    assert bad(raw).field == key


def test_fraction_that_rounds_to_zero_milli_is_rejected():
    err = bad({"name": "x", "kind": "shared", "fraction": 0.0001})
    assert err.field == "fraction"


def test_unknown_model_in_offer():
    err = bad({"name": "x", "kind": "gpu", "models": ["H100-80GB", "Z9000"]})
    assert isinstance(err, UnknownModel)
    assert "Z9000" in str(err)
    assert "H100-80GB" in err.allowed


@pytest.mark.parametrize("groups", ["staff", ["staff", 1]])
def test_groups_must_be_a_list_of_names(groups):
    assert bad({"name": "x", "kind": "gpu", "groups": groups}).field == "groups"


# ---------------------------------------------------------------------------------------------
# Valid offers


def test_mig_offer_round_trip():
    raw = {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]}
    offer = parse_offer(raw, CATALOG)
    assert offer == Offer(
        name="a100-1g",
        kind="mig",
        display_name="a100-1g",
        profile="1g.10gb",
        models=("A100-80GB",),
    )
    assert offer.milli == 0
    assert offer_units(offer, CATALOG.model("A100-80GB")) == Fraction(1, 7)


def test_gpu_offer_resolves_nvml_product_names():
    raw = {
        "name": "h100",
        "kind": "gpu",
        "count": 2,
        "models": ["NVIDIA H100 80GB HBM3", "nvidia h100 nvl", "A100-SXM4-40GB"],
    }
    offer = parse_offer(raw, CATALOG)
    assert offer.models == ("H100-80GB", "H100-NVL-94GB", "A100-40GB")
    assert offer.count == 2
    assert offer.display_name == "h100"
    assert offer.milli == 1000
    assert offer.allows_model("H100-80GB")
    assert not offer.allows_model("A30-24GB")
    assert offer_units(offer, CATALOG.model("H100-80GB")) == 2


def test_mig_offer_resolves_nvml_product_names():
    raw = {"name": "m", "kind": "mig", "profile": "3g.40gb", "models": ["NVIDIA H100 PCIe"]}
    assert parse_offer(raw, CATALOG).models == ("H100-80GB",)


def test_shared_offer_round_trip():
    raw = {"name": "shared-small", "kind": "shared", "fraction": 0.25, "min_memory_gb": 10}
    offer = parse_offer(raw, CATALOG)
    assert offer.fraction == 0.25
    assert offer.milli == 250
    assert offer.min_memory_gb == 10.0
    assert offer.models == ()
    assert offer.allows_model("T4")
    assert offer.display_name == "shared-small"
    assert offer_units(offer, CATALOG.model("T4")) == Fraction(1, 4)


def test_explicit_display_name_and_groups_kept():
    raw = {
        "name": "big",
        "kind": "gpu",
        "display_name": "Four H100s",
        "description": "for training",
        "groups": ["ml", "staff"],
        "priority_class": "high",
        "cpu_milli": 8000,
        "memory_mib": 65536,
        "count": 4,
        "models": ["H100-80GB"],
    }
    offer = parse_offer(raw, CATALOG)
    assert offer.display_name == "Four H100s"
    assert offer.groups == ("ml", "staff")
    assert offer.visible_to(["staff"])
    assert not offer.visible_to(["students"])
    assert (offer.cpu_milli, offer.memory_mib) == (8000, 65536)


@pytest.mark.parametrize(
    ("key", "target"), [("idle_timeout", "idle_timeout"), ("reclaim_policy", "action")]
)
def test_reclaim_keys_on_an_offer_say_where_they_belong(key, target):
    """Early configs put these on the offer, where nothing read them: refuse them, naming the
    reclaim policy field that does what was meant."""
    err = bad({"name": "big", "kind": "gpu", key: 600})
    assert err.field == key
    assert f"reclaim.offers.big.{target}" in str(err)


def test_cpu_offer():
    offer = parse_offer({"name": "cpu", "kind": "cpu"}, CATALOG)
    assert offer.kind == "cpu"
    assert offer_units(offer, CATALOG.model("T4")) == 0


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "count": 2, "models": ["NVIDIA H100 80GB HBM3"]},
        {"name": "s", "kind": "shared", "fraction": 0.5, "min_memory_gb": 8, "groups": ["g"]},
        {"name": "c", "kind": "cpu", "display_name": "CPU only"},
    ],
)
def test_parsed_offer_parses_back_to_itself(raw):
    offer = parse_offer(raw, CATALOG)
    again = {k: v for k, v in asdict(offer).items() if v is not None}
    assert parse_offer(again, CATALOG) == offer


# ---------------------------------------------------------------------------------------------
# Allocator: requests that can never be granted, and bad inventory

H100 = CATALOG.model("H100-80GB")
A100 = CATALOG.model("A100-80GB")


def node(name, n, model=H100, prefix=None, **gpu_kw):
    prefix = prefix or name
    return Node(name, gpus=[Gpu(f"{prefix}-gpu{i}", i, model, **gpu_kw) for i in range(n)])


def offer(raw):
    return parse_offer(raw, CATALOG)


OFFERS = [
    offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}),
    offer({"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]}),
    offer({"name": "h100x8", "kind": "gpu", "count": 8, "models": ["H100-80GB"]}),
    offer({"name": "any-x5", "kind": "gpu", "count": 5}),
    offer({"name": "a100", "kind": "gpu", "models": ["A100-80GB"]}),
    offer({"name": "h100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["H100-80GB"]}),
    offer({"name": "t4-half", "kind": "shared", "fraction": 0.5, "models": ["T4"]}),
]


def allocator():
    return Allocator([node("n1", 2), node("n2", 4)], OFFERS)


def submit(alloc, offer_name, rid="r1"):
    return alloc.submit(Request(rid, "alice", offer_name), now=0.0)


@pytest.mark.parametrize("name", ["h100x8", "any-x5"])
def test_more_gpus_than_any_node_has(name):
    decision = submit(allocator(), name)
    assert isinstance(decision, Rejected)
    assert decision.code == "exceeds_node_size"
    assert decision.field == "count"
    assert list(decision.allowed) == [1, 2, 3, 4]


def test_as_many_gpus_as_the_largest_node_is_granted():
    decision = submit(allocator(), "h100x4")
    assert isinstance(decision, Grant)
    assert decision.node == "n2"
    assert len(decision.slots) == 4


def test_exceeds_node_size_counts_per_node_not_per_pool():
    # 6 H100s in the pool, but at most 4 on one node
    alloc = Allocator([node("n1", 3), node("n2", 3)], OFFERS)
    decision = submit(alloc, "h100x4")
    assert isinstance(decision, Rejected)
    assert decision.code == "exceeds_node_size"
    assert list(decision.allowed) == [1, 2, 3]


@pytest.mark.parametrize("name", ["a100", "h100-1g", "t4-half"])
def test_offer_for_hardware_absent_from_pool(name):
    # no A100, no T4, and the H100s are not in MIG mode
    decision = submit(allocator(), name)
    assert isinstance(decision, Rejected)
    assert decision.code == "no_such_hardware"


def test_mig_offer_granted_once_hardware_has_mig():
    alloc = Allocator([node("n1", 1, mig_enabled=True, dynamic_mig=True)], OFFERS)
    decision = submit(alloc, "h100-1g")
    assert isinstance(decision, Grant)
    assert decision.slots[0].profile == "1g.10gb"


def test_unknown_offer():
    decision = submit(allocator(), "h200")
    assert isinstance(decision, Rejected)
    assert decision.code == "unknown_offer"
    assert decision.field == "offer"
    assert list(decision.allowed) == [o.name for o in OFFERS]


@pytest.mark.parametrize(
    "instances",
    [
        [("3g.40gb", 0), ("2g.20gb", 2)],  # overlap
        [("2g.20gb", 6)],  # no such start
        [("1g.10gb+me", 0), ("1g.10gb+me", 1)],  # two +me
        [("7g.80gb", 0), ("1g.10gb", 0)],
    ],
)
def test_illegal_mig_layout_in_inventory(instances):
    gpu = Gpu("g0", 0, H100, mig_enabled=True, instances=[MigInstance(p, s) for p, s in instances])
    with pytest.raises(MigLayoutError):
        Allocator([Node("n1", gpus=[gpu])], OFFERS)


def test_legal_mig_layout_in_inventory_accepted():
    layout = [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]
    gpu = Gpu("g0", 0, H100, mig_enabled=True, instances=[MigInstance(p, s) for p, s in layout])
    alloc = Allocator([Node("n1", gpus=[gpu])], OFFERS)
    assert isinstance(submit(alloc, "h100-1g"), Grant)


def test_mig_instances_on_gpu_without_mig_mode():
    gpu = Gpu("g0", 0, H100, instances=[MigInstance("1g.10gb", 0)])
    with pytest.raises(ConfigError):
        Allocator([Node("n1", gpus=[gpu])], OFFERS)


def test_mig_mode_on_model_without_mig():
    gpu = Gpu("g0", 0, CATALOG.model("T4"), mig_enabled=True)
    with pytest.raises(ConfigError):
        Allocator([Node("n1", gpus=[gpu])], OFFERS)


def test_duplicate_gpu_uuid_across_nodes():
    with pytest.raises(ConfigError) as info:
        Allocator([node("n1", 2, prefix="same"), node("n2", 2, prefix="same")], OFFERS)
    assert info.value.field == "uuid"
    assert "same-gpu0" in str(info.value)


def test_duplicate_gpu_uuid_within_a_node():
    gpus = [Gpu("dup", 0, H100), Gpu("dup", 1, H100)]
    with pytest.raises(ConfigError) as info:
        Allocator([Node("n1", gpus=gpus)], OFFERS)
    assert info.value.field == "uuid"


def test_duplicate_node_name():
    with pytest.raises(ConfigError):
        Allocator([node("n1", 1, prefix="a"), node("n1", 1, prefix="b")], OFFERS)
