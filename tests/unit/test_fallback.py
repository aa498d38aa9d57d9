"""Devices a grant may fall back to with DRA (``pool.fallback``), the offer field that allows
it, and the rebind that follows refusing a device another lease holds (``exclusive``)."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator, Grant
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError, Refusal
from jupyterhub_gpupool.pool.fallback import MAX_FALLBACK, fallback_devices
from jupyterhub_gpupool.pool.model import Gpu, MigInstance, Node, Request, parse_offer
from jupyterhub_gpupool.pool.outside import mark_exact, rebind
from jupyterhub_gpupool.pool.placement import Slot

CATALOG = default_catalog()
H100, A100, L4 = (CATALOG.model(m) for m in ("H100-80GB", "A100-80GB", "L4"))


def offers(fallback: bool = True):
    return [
        parse_offer(o, CATALOG)
        for o in (
            {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "fallback": fallback},
            {"name": "1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]}
            | ({"fallback": True} if fallback else {}),
        )
    ]


def nodes() -> list[Node]:
    gpus = [Gpu(f"H{i}", i, H100) for i in range(5)] + [Gpu("L0", 5, L4)]
    inst = [MigInstance("1g.10gb", s, f"MIG-{s}") for s in range(4)]
    return [
        Node("h", gpus=gpus),
        Node("m", gpus=[Gpu("A0", 0, A100, mig_enabled=True, instances=inst)]),
    ]


def grant(alloc: Allocator, rid: str, offer: str) -> Grant:
    decision = alloc.submit(Request(rid, "u", offer), 0.0)
    assert isinstance(decision, Grant), decision
    return decision


def test_alternatives_are_free_devices_of_the_offer_on_the_granted_node():
    alloc = Allocator(nodes(), offers())
    first = grant(alloc, "a", "h100")
    assert first.slots[0].gpu == "H0"
    node = alloc.nodes["h"]
    # not its own, not another model, lowest first, at most MAX_FALLBACK
    assert [s.gpu for s in fallback_devices(node, alloc.offers["h100"], first.slots)] == [
        "H1",
        "H2",
        "H3",
    ][:MAX_FALLBACK]
    grant(alloc, "b", "h100")  # H1 is b's now
    alloc.set_outside("h", mark_exact(node, [("H2", None, "ml/train")]))  # H2 outside
    node.gpus[3].cordoned = True
    alts = fallback_devices(node, alloc.offers["h100"], first.slots)
    assert [s.gpu for s in alts] == ["H4"]
    mig = grant(alloc, "c", "1g")
    alts = fallback_devices(alloc.nodes["m"], alloc.offers["1g"], mig.slots)
    assert [(s.kind, s.profile, s.start) for s in alts] == [
        ("mig", "1g.10gb", st) for st in (1, 2, 3)
    ]


def test_no_alternatives_where_the_offer_does_not_allow_them():
    alloc = Allocator(nodes(), offers(fallback=False))
    first = grant(alloc, "a", "h100")
    assert fallback_devices(alloc.nodes["h"], alloc.offers["h100"], first.slots) == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "x", "kind": "gpu", "fallback": "yes"}, "fallback must be true or false"),
        (
            {"name": "x", "kind": "shared", "fraction": 0.5, "fallback": True},
            "only gpu and mig offers fall back",
        ),
        ({"name": "x", "kind": "cpu", "fallback": True}, "only gpu and mig offers fall back"),
    ],
)
def test_the_offer_field_is_checked(raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_offer(raw, CATALOG)
    assert info.value.field == "fallback"


def test_fallback_defaults_to_off_and_is_kept():
    assert parse_offer({"name": "x", "kind": "gpu"}, CATALOG).fallback is False
    assert parse_offer({"name": "x", "kind": "gpu", "fallback": True}, CATALOG).fallback is True


def test_an_exclusive_rebind_onto_another_leases_device_is_refused_not_swapped():
    alloc = Allocator(nodes(), offers())
    a, b = grant(alloc, "a", "h100"), grant(alloc, "b", "h100")
    node = alloc.nodes["h"]
    held = {"b": b.slots}
    swapped = rebind("a", a.slots, ["H1"], node, held)  # the device plugin's case: a swap
    assert swapped.others == {"b": (Slot("H0", "gpu"),)}
    with pytest.raises(Refusal, match="granted to lease b") as info:
        rebind("a", a.slots, ["H1"], node, held, exclusive=True)
    assert info.value.code == "device_held"
    moved = rebind("a", a.slots, ["H3"], node, held, exclusive=True)  # a free one: moves
    assert moved.slots == (Slot("H3", "gpu"),) and not moved.others
