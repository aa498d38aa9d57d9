"""GPU models and NVIDIA MIG profiles: what exists, how it may be cut, what a piece is worth.

The MIG tables come from the shipped ``data/mig_profiles.json`` (NVIDIA's profile tables and
``nvidia-smi mig -lgipp`` placements; see ``data/README.md``). GPUs without MIG are first-class:
the catalog knows the common ones and admins may declare others (the public Alibaba trace's
anonymised ``G2``/``G3`` models, say). At run time NVML's own profile and placement answers win;
``Catalog.with_nvml_placements`` is the hook for that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any, cast

from .errors import UnknownModel, UnknownProfile

#: How a profile's placements are known: read from NVIDIA output for this very GPU, copied from
#: the confirmed table of a GPU with the same geometry and profile IDs, or derived from the
#: alignment rule (start is a multiple of the size) where no table exists at all.
PLACEMENT_STATUSES = ("confirmed", "inferred", "derived")

_ARCHITECTURES = {
    "A100": "ampere",
    "A30": "ampere",
    "A10": "ampere",
    "A10G": "ampere",
    "H100": "hopper",
    "GH200": "hopper",
    "H200": "hopper",
    "H20": "hopper",
    "B200": "blackwell",
    "GB200": "blackwell",
    "B300": "blackwell",
    "GB300": "blackwell",
    "RTX-PRO": "blackwell",
}


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model (e.g. ``1g.10gb`` on an A100-80GB)."""

    name: str
    id: int | None
    compute_slices: int
    memory_slices: int
    max_count: int
    memory_gb: float | None
    starts: tuple[int, ...]
    placement_status: str
    media_extensions: bool = False

    @property
    def size(self) -> int:
        """Memory slices one instance occupies (the placement ``size``)."""
        return self.memory_slices

    @property
    def resource_name(self) -> str:
        """The k8s-device-plugin ``mixed`` strategy resource (``+`` becomes ``.``)."""
        return "nvidia.com/mig-" + self.name.replace("+", ".")


@dataclass(frozen=True, eq=False)
class GpuModel:
    """A GPU model: memory, architecture and, for MIG-capable ones, the profile table.

    Compared and hashed by identity: one object per model per catalog, so placement can key
    its caches on it.
    """

    name: str
    memory_gb: float
    architecture: str = "unknown"
    product_names: tuple[str, ...] = ()
    compute_slices: int = 0
    memory_slices: int = 0
    profiles: Mapping[str, MigProfile] = field(default_factory=dict)
    unit_weight: float = 1.0

    @property
    def mig_capable(self) -> bool:
        """True when the model can be partitioned into MIG instances."""
        return bool(self.profiles)

    @property
    def gpm_supported(self) -> bool:
        """GPM (per-MIG-instance utilization) exists on Hopper and newer only."""
        return self.architecture in ("hopper", "blackwell")

    def profile(self, name: str) -> MigProfile:
        """The named profile, or an error listing the profiles this model has."""
        if not self.mig_capable:
            raise UnknownProfile(
                f"GPU model {self.name} does not support MIG", field="profile", allowed=[]
            )
        try:
            return self.profiles[name]
        except KeyError:
            raise UnknownProfile(
                f"MIG profile {name!r} does not exist on {self.name}",
                field="profile",
                allowed=list(self.profiles),
            ) from None

    def profile_units(self, name: str) -> Fraction:
        """GPU units of one instance: its dominant share of the GPU.

        1g.10gb on an A100-80GB is max(1/7, 1/8) = 1/7; 3g.40gb is max(3/7, 4/8) = 1/2.
        """
        p = self.profile(name)
        return max(
            Fraction(p.compute_slices, self.compute_slices),
            Fraction(p.memory_slices, self.memory_slices),
        )


def _family(name: str) -> str:
    for prefix in sorted(_ARCHITECTURES, key=len, reverse=True):
        if name.upper().startswith(prefix):
            return _ARCHITECTURES[prefix]
    return "unknown"


def _derived_starts(size: int, memory_slices: int) -> tuple[int, ...]:
    """Aligned starts (start % size == 0), the rule every NVIDIA table follows.

    Only used where no table exists for the GPU or for any GPU of the same shape (RTX PRO 6000
    Blackwell, whose placements were never published).
    """
    return tuple(range(0, memory_slices - size + 1, size))


def _load_mig_models(raw: Mapping[str, object]) -> dict[str, GpuModel]:
    gpus = cast("Mapping[str, Any]", raw["gpus"])  # JSON, checked by tests/unit/test_mig_data.py
    # Confirmed placements by (GPU shape, profile shape): GPUs without a table of their own borrow
    # them, like ``placements_inferred`` does in the JSON, and are marked "inferred".
    known: dict[tuple[int, int, int, int, bool], list[int]] = {}
    for spec in gpus.values():
        for p in spec["profiles"]:
            if p.get("placements"):
                shape = (
                    spec["compute_slices"],
                    spec["memory_slices"],
                    p["compute_slices"],
                    p["memory_slices"],
                    "+me" in p["name"],
                )
                known.setdefault(shape, [x["start"] for x in p["placements"]])
    models: dict[str, GpuModel] = {}
    for key, spec in gpus.items():
        profiles: dict[str, MigProfile] = {}
        ms, cs = spec["memory_slices"], spec["compute_slices"]
        for p in spec["profiles"]:
            shape = (cs, ms, p["compute_slices"], p["memory_slices"], "+me" in p["name"])
            if p.get("placements"):
                starts, status = [x["start"] for x in p["placements"]], "confirmed"
                sizes = {x["size"] for x in p["placements"]}
            elif p.get("placements_inferred"):
                starts, status = [x["start"] for x in p["placements_inferred"]], "inferred"
                sizes = {x["size"] for x in p["placements_inferred"]}
            elif shape in known:
                starts, status, sizes = known[shape], "inferred", {p["memory_slices"]}
            else:
                starts = list(_derived_starts(p["memory_slices"], ms))
                status, sizes = "derived", {p["memory_slices"]}
            if sizes != {p["memory_slices"]}:
                raise ValueError(f"{key} {p['name']}: placement size disagrees with memory slices")
            profiles[p["name"]] = MigProfile(
                name=p["name"],
                id=p["id"] if p["id"] is not None else p.get("id_inferred"),
                compute_slices=p["compute_slices"],
                memory_slices=p["memory_slices"],
                max_count=p["max_count"],
                memory_gb=p.get("memory_gb"),
                starts=tuple(starts),
                placement_status=status,
                media_extensions="+me" in p["name"],
            )
        memory_gb = spec.get("memory_gb") or _memory_from_profiles(profiles)
        models[key] = GpuModel(
            name=key,
            memory_gb=float(memory_gb),
            architecture=_family(key),
            product_names=tuple(spec.get("product_names", ())),
            compute_slices=cs,
            memory_slices=ms,
            profiles=profiles,
        )
    return models


def _memory_from_profiles(profiles: Mapping[str, MigProfile]) -> float:
    full = max(profiles.values(), key=lambda p: p.memory_slices)
    name_gb = full.name.split(".")[1].removesuffix("gb")
    return float(name_gb)


#: GPUs without MIG that pools commonly hold, with NVML product names. The last rows are the
#: anonymised models of the public Alibaba GPU trace (memory not published; nominal 16 GB).
_NON_MIG = [
    ("T4", 16, "turing", ("Tesla T4",)),
    ("L4", 24, "ada", ("NVIDIA L4",)),
    ("L40S", 48, "ada", ("NVIDIA L40S",)),
    ("A10", 24, "ampere", ("NVIDIA A10",)),
    ("A10G", 24, "ampere", ("NVIDIA A10G",)),
    ("A40", 48, "ampere", ("NVIDIA A40",)),
    ("RTX-A6000", 48, "ampere", ("NVIDIA RTX A6000",)),
    ("RTX-4090", 24, "ada", ("NVIDIA GeForce RTX 4090",)),
    ("V100-16GB", 16, "volta", ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB")),
    ("V100-32GB", 32, "volta", ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB")),
    ("P100", 16, "pascal", ("Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB")),
    ("V100M16", 16, "volta", ()),
    ("V100M32", 32, "volta", ()),
    ("G2", 16, "unknown", ()),
    ("G3", 16, "unknown", ()),
]


class Catalog:
    """Every GPU model the pool knows, looked up by catalog name or NVML product name."""

    def __init__(self, models: Iterable[GpuModel]) -> None:
        self._models: dict[str, GpuModel] = {}
        self._by_product: dict[str, str] = {}
        for m in models:
            self.register(m)

    def register(self, model: GpuModel) -> GpuModel:
        """Add (or replace) a model, e.g. one an admin declares in the pool config."""
        self._models[model.name] = model
        self._by_product[model.name.lower()] = model.name
        for product in model.product_names:
            self._by_product[product.lower()] = model.name
        return model

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.strip().lower() in self._by_product

    def __iter__(self) -> Iterator[GpuModel]:
        return iter(self._models.values())

    @property
    def names(self) -> list[str]:
        """Catalog names, in registration order."""
        return list(self._models)

    def model(self, name: str) -> GpuModel:
        """Look up by catalog name (``A100-80GB``) or NVML name (``NVIDIA A100-SXM4-80GB``)."""
        key = self._by_product.get(name.strip().lower())
        if key is None:
            raise UnknownModel(f"unknown GPU model {name!r}", field="model", allowed=self.names)
        return self._models[key]

    def model_for_nvml(self, product_name: str, memory_mib: int) -> GpuModel:
        """The model NVML reports; an unknown product becomes a plain (non-MIG) model of its own.

        A GPU the catalog has never heard of must still be usable whole or shared, so it is
        registered under its product name rather than rejected.
        """
        product_name = product_name.strip()
        if product_name in self:
            return self.model(product_name)
        name = product_name.removeprefix("NVIDIA ").replace(" ", "-")
        return self.register(
            GpuModel(
                name=name,
                memory_gb=round(memory_mib / 1024, 1),
                architecture=_family(name),
                product_names=(product_name,),
            )
        )

    def with_nvml_placements(self, model: str, starts: Mapping[str, Iterable[int]]) -> GpuModel:
        """Replace a model's placements with what NVML reported for a real GPU (NVML wins)."""
        m = self.model(model)
        profiles = dict(m.profiles)
        for name, found in starts.items():
            profiles[name] = replace(
                m.profile(name), starts=tuple(sorted(found)), placement_status="confirmed"
            )
        return self.register(replace(m, profiles=profiles))


@cache
def _mig_json(path: str) -> dict[str, Any]:
    table: dict[str, Any] = json.loads(Path(path).read_text())
    return table


def default_catalog() -> Catalog:
    """A fresh catalog with NVIDIA's MIG-capable models and the common non-MIG ones."""
    from ..data import data_path

    raw = _mig_json(str(data_path("mig_profiles.json")))
    models = list(_load_mig_models(raw).values())
    models += [
        GpuModel(name=n, memory_gb=float(gb), architecture=arch, product_names=pn)
        for n, gb, arch, pn in _NON_MIG
    ]
    return Catalog(models)
