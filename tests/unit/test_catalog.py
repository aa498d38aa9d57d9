"""The GPU catalog: shipped MIG tables, lookups, placement provenance, units and NVML hooks.

Expected values come from NVIDIA's tables as collected in ``shared/reference/mig_facts.md``
(§1.1 profile IDs, §1.2/§1.3 placements, §1.5 per-GPU tables, §4.1 resource names).
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction

import pytest

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.pool.catalog import PLACEMENT_STATUSES, default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError, MigLayoutError, UnknownModel, UnknownProfile
from jupyterhub_gpupool.pool.miglayout import mig_new_starts, validate_mig_layout
from jupyterhub_gpupool.pool.model import parse_offer

#: sha256 of the canonical form (sorted keys, compact separators, UTF-8) of
#: ``shared/reference/mig_profiles.json``. The shipped copy must be the same data; when the
#: reference changes, copy it into ``jupyterhub_gpupool/data/`` and update this digest.
REFERENCE_SHA256 = "f358b2c8aedffab8d33028f15b401939918408f4ae5c239258d3dde1eace5c2c"


def shipped_json():
    return json.loads(data_path("mig_profiles.json").read_text(encoding="utf-8"))


SHIPPED = shipped_json()
SHIPPED_MODELS = list(SHIPPED["gpus"])


@pytest.fixture
def catalog():
    return default_catalog()


# ---------------------------------------------------------------------------------------------
# The shipped data file


def test_shipped_data_equals_reference():
    canonical = json.dumps(SHIPPED, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == REFERENCE_SHA256


def test_shipped_data_has_the_documented_models():
    assert {
        "A100-40GB",
        "A100-80GB",
        "A30-24GB",
        "H100-80GB",
        "H100-NVL-94GB",
        "H200-141GB",
        "GH200-96GB",
        "B200-180GB",
    } <= set(SHIPPED_MODELS)


# ---------------------------------------------------------------------------------------------
# Loading and lookups


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_every_shipped_model_is_loaded(catalog, name):
    spec = SHIPPED["gpus"][name]
    model = catalog.model(name)
    assert model.name == name
    assert model.mig_capable
    assert (model.compute_slices, model.memory_slices) == (
        spec["compute_slices"],
        spec["memory_slices"],
    )
    assert list(model.profiles) == [p["name"] for p in spec["profiles"]]
    for p in spec["profiles"]:
        prof = model.profile(p["name"])
        assert prof.compute_slices == p["compute_slices"]
        assert prof.memory_slices == p["memory_slices"]
        assert prof.max_count == p["max_count"]
        assert prof.placement_status in PLACEMENT_STATUSES
        assert prof.starts, p["name"]
        assert all(0 <= s <= model.memory_slices - prof.size for s in prof.starts), p["name"]
        if p.get("placements"):
            assert prof.starts == tuple(x["start"] for x in p["placements"])
    if spec.get("memory_gb"):
        assert model.memory_gb == spec["memory_gb"]


@pytest.mark.parametrize(
    "product,name",
    [
        (product, name)
        for name, spec in SHIPPED["gpus"].items()
        for product in spec.get("product_names", [])
    ],
)
def test_lookup_by_every_nvml_product_name(catalog, product, name):
    assert catalog.model(product).name == name
    assert catalog.model(product.upper()).name == name
    assert catalog.model(product.lower()).name == name
    assert catalog.model(f"  {product} ").name == name
    assert product in catalog


@pytest.mark.parametrize(
    "product,name",
    [
        ("A100-SXM4-40GB", "A100-40GB"),  # R450-R470 nvidia-smi, no "NVIDIA " prefix
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-PCIE-32GB", "V100-32GB"),
        ("Tesla P100-PCIE-16GB", "P100"),
        ("nvidia a10", "A10"),
    ],
)
def test_lookup_known_product_names(catalog, product, name):
    assert catalog.model(product).name == name


@pytest.mark.parametrize("name", ["a100-80gb", "H100-NVL-94GB", "h200-141gb", "t4", "g2"])
def test_lookup_by_catalog_name_is_case_insensitive(catalog, name):
    assert catalog.model(name).name.lower() == name.lower()


def test_lookup_returns_one_object_per_model(catalog):
    assert catalog.model("NVIDIA H100 80GB HBM3") is catalog.model("H100-80GB")


@pytest.mark.parametrize("name", ["A100", "NVIDIA A100", "H100", "V100", "Tesla K80", ""])
def test_unknown_model_lists_the_known_names(catalog, name):
    with pytest.raises(UnknownModel) as info:
        catalog.model(name)
    err = info.value
    assert isinstance(err, ConfigError)
    assert err.code == "unknown_gpu_model"
    assert err.field == "model"
    assert err.allowed == catalog.names
    assert {"A100-80GB", "H100-80GB", "T4", "G2"} <= set(err.allowed)
    assert name not in catalog


# ---------------------------------------------------------------------------------------------
# Placement provenance


@pytest.mark.parametrize("name", ["A100-40GB", "H100-80GB", "H100-NVL-94GB", "A30-24GB"])
def test_placements_confirmed_where_nvidia_output_exists(catalog, name):
    assert {p.placement_status for p in catalog.model(name).profiles.values()} == {"confirmed"}


def test_a100_80gb_placements_inferred_except_3g(catalog):
    statuses = {n: p.placement_status for n, p in catalog.model("A100-80GB").profiles.items()}
    assert statuses.pop("3g.40gb") == "confirmed"  # seen via -lgi at 0:4 and 4:4
    assert set(statuses.values()) == {"inferred"}
    assert len(statuses) == 6


def test_h200_placements_inferred(catalog):
    model = catalog.model("H200-141GB")
    assert {p.placement_status for p in model.profiles.values()} == {"inferred"}
    # inferred from the confirmed 7x8 table
    assert model.profile("1g.18gb").starts == (0, 1, 2, 3, 4, 5, 6)
    assert model.profile("1g.35gb").starts == (0, 2, 4, 6)
    assert model.profile("2g.35gb").starts == (0, 2, 4)
    assert model.profile("3g.71gb").starts == (0, 4)


# ---------------------------------------------------------------------------------------------
# Profile IDs (nvidia-smi mig -lgip; not the NVML enum values)


@pytest.mark.parametrize(
    "name,ids",
    [
        (
            "A100-40GB",
            {
                "1g.5gb": 19,
                "1g.5gb+me": 20,
                "1g.10gb": 15,
                "2g.10gb": 14,
                "3g.20gb": 9,
                "4g.20gb": 5,
                "7g.40gb": 0,
            },
        ),
        (
            "H100-80GB",
            {
                "1g.10gb": 19,
                "1g.10gb+me": 20,
                "1g.20gb": 15,
                "2g.20gb": 14,
                "3g.40gb": 9,
                "4g.40gb": 5,
                "7g.80gb": 0,
            },
        ),
        (
            "A30-24GB",
            {"1g.6gb": 14, "1g.6gb+me": 21, "2g.12gb": 5, "2g.12gb+me": 6, "4g.24gb": 0},
        ),
    ],
)
def test_profile_ids(catalog, name, ids):
    model = catalog.model(name)
    assert {n: p.id for n, p in model.profiles.items()} == ids


# ---------------------------------------------------------------------------------------------
# Non-MIG models


@pytest.mark.parametrize(
    "name",
    ["T4", "L4", "V100-16GB", "V100-32GB", "G2", "G3", "V100M16", "V100M32", "P100", "A10"],
)
def test_non_mig_models_present(catalog, name):
    model = catalog.model(name)
    assert model.name == name
    assert not model.mig_capable
    assert model.profiles == {}
    assert model.memory_gb > 0


@pytest.mark.parametrize("name", ["T4", "G2", "V100M32"])
def test_profile_on_non_mig_model(catalog, name):
    with pytest.raises(UnknownProfile) as info:
        catalog.model(name).profile("1g.10gb")
    assert info.value.allowed == []
    assert info.value.field == "profile"
    assert info.value.code == "unknown_mig_profile"


def test_unknown_profile_lists_the_models_profiles(catalog):
    model = catalog.model("A100-80GB")
    with pytest.raises(UnknownProfile) as info:
        model.profile("1g.5gb")
    assert info.value.allowed == list(model.profiles)
    assert "1g.10gb" in info.value.allowed
    assert "1g.5gb" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Units, resources, media extensions, GPM


@pytest.mark.parametrize(
    "name,profile,units",
    [
        ("A100-80GB", "1g.10gb", Fraction(1, 7)),
        ("A100-80GB", "1g.10gb+me", Fraction(1, 7)),
        ("A100-80GB", "1g.20gb", Fraction(1, 4)),  # 2 memory slices, 1 compute: 2/8 > 1/7
        ("A100-80GB", "2g.20gb", Fraction(2, 7)),
        ("A100-80GB", "3g.40gb", Fraction(1, 2)),  # 4/8 > 3/7
        ("A100-80GB", "4g.40gb", Fraction(4, 7)),
        ("A100-80GB", "7g.80gb", Fraction(1)),
        ("A100-40GB", "1g.5gb", Fraction(1, 7)),
        ("H100-NVL-94GB", "3g.47gb", Fraction(1, 2)),
        ("H200-141GB", "1g.35gb", Fraction(1, 4)),
        ("A30-24GB", "1g.6gb", Fraction(1, 4)),
        ("A30-24GB", "2g.12gb", Fraction(1, 2)),
        ("A30-24GB", "2g.12gb+me", Fraction(1, 2)),
        ("A30-24GB", "4g.24gb", Fraction(1)),
    ],
)
def test_profile_units(catalog, name, profile, units):
    got = catalog.model(name).profile_units(profile)
    assert isinstance(got, Fraction)
    assert got == units


def test_seven_1g_slices_make_exactly_one_gpu(catalog):
    assert 7 * catalog.model("H100-80GB").profile_units("1g.10gb") == 1


@pytest.mark.parametrize(
    "name,profile,resource",
    [
        ("A100-80GB", "1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("A100-80GB", "3g.40gb", "nvidia.com/mig-3g.40gb"),
        ("A30-24GB", "2g.12gb+me", "nvidia.com/mig-2g.12gb.me"),
        ("H100-NVL-94GB", "1g.12gb", "nvidia.com/mig-1g.12gb"),
    ],
)
def test_resource_name(catalog, name, profile, resource):
    assert catalog.model(name).profile(profile).resource_name == resource


@pytest.mark.parametrize("name", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "A30-24GB"])
def test_media_extensions_flag(catalog, name):
    for p in catalog.model(name).profiles.values():
        assert p.media_extensions == p.name.endswith("+me"), p.name
        if p.media_extensions:
            assert p.max_count == 1


@pytest.mark.parametrize(
    "name,supported",
    [
        ("H100-80GB", True),
        ("H100-NVL-94GB", True),
        ("H200-141GB", True),
        ("A100-40GB", False),
        ("A100-80GB", False),
        ("A30-24GB", False),
        ("T4", False),
    ],
)
def test_gpm_supported(catalog, name, supported):
    assert catalog.model(name).gpm_supported is supported


# ---------------------------------------------------------------------------------------------
# NVML hooks


def test_model_for_nvml_known_product_returns_catalog_model(catalog):
    before = catalog.names
    model = catalog.model_for_nvml("NVIDIA H100 80GB HBM3", 81559)
    assert model is catalog.model("H100-80GB")
    assert catalog.model_for_nvml("tesla t4", 15360) is catalog.model("T4")
    assert catalog.names == before


def test_model_for_nvml_registers_unknown_product(catalog):
    product = "NVIDIA Quadro Future 9000"
    assert product not in catalog
    model = catalog.model_for_nvml(product, 49152)
    assert not model.mig_capable
    assert model.memory_gb == 48.0
    assert model.name in catalog.names
    assert catalog.model(product) is model
    assert catalog.model(model.name) is model
    assert catalog.model(product.lower()) is model
    # the second report of the same GPU finds the same model
    assert catalog.model_for_nvml(product, 49152) is model
    # usable afterwards: an offer may name it, by model name or NVML name
    offer = parse_offer({"name": "q", "kind": "gpu", "models": [product]}, catalog)
    assert offer.models == (model.name,)
    # but it has no MIG
    with pytest.raises(UnknownProfile):
        model.profile("1g.10gb")


def test_model_for_nvml_unknown_product_is_per_catalog(catalog):
    catalog.model_for_nvml("NVIDIA Quadro Future 9000", 49152)
    assert "NVIDIA Quadro Future 9000" not in default_catalog()


def test_with_nvml_placements_overrides_and_confirms(catalog):
    model = catalog.with_nvml_placements("A100-80GB", {"1g.10gb": [6, 0, 1], "2g.20gb": (0, 2)})
    assert catalog.model("A100-80GB") is model
    assert catalog.model("NVIDIA A100-SXM4-80GB") is model
    assert model.profile("1g.10gb").starts == (0, 1, 6)
    assert model.profile("1g.10gb").placement_status == "confirmed"
    assert model.profile("2g.20gb").starts == (0, 2)
    assert model.profile("2g.20gb").placement_status == "confirmed"
    # untouched profiles keep their data and provenance
    assert model.profile("1g.20gb").starts == (0, 2, 4, 6)
    assert model.profile("1g.20gb").placement_status == "inferred"
    assert model.profile("3g.40gb").placement_status == "confirmed"
    # and the rules follow the new placements
    validate_mig_layout(model, [("1g.10gb", 6)])
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(model, [("1g.10gb", 2)])
    assert info.value.allowed == [0, 1, 6]
    assert mig_new_starts(model, [], "2g.20gb") == (0, 2)


def test_with_nvml_placements_does_not_leak_into_fresh_catalogs(catalog):
    catalog.with_nvml_placements("A100-80GB", {"1g.10gb": [0]})
    fresh = default_catalog().model("A100-80GB").profile("1g.10gb")
    assert fresh.starts == (0, 1, 2, 3, 4, 5, 6)
    assert fresh.placement_status == "inferred"


def test_with_nvml_placements_unknown_profile(catalog):
    with pytest.raises(UnknownProfile) as info:
        catalog.with_nvml_placements("A100-80GB", {"1g.5gb": [0]})
    assert "1g.10gb" in info.value.allowed
