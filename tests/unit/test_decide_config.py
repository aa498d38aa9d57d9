"""A pool config's load decided by ``pool.decide`` (``pool.rules.config``): the rows it writes,
what its removals end, what it refuses, as effects, checked to change nothing when decided;
and the allocator they leave once applied (``pool.offertable``, ``pool.nodeput.put_node``)
compared with one made from scratch with the same offers, quotas, nodes and leases."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import (
    BorrowedChanged,
    ConfigLoaded,
    FileQuotaLoaded,
    LeaseGranted,
    LeaseNoted,
    LeaseReleased,
    MigFailed,
    NodeDeclared,
    OfferDropped,
    OfferLoaded,
    OffersOrdered,
    PricesLoaded,
)
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.facts import ConfigRows
from jupyterhub_gpupool.pool.model import RETIRING, Gpu, MigInstance, Node, Request, parse_offer
from jupyterhub_gpupool.pool.outside import OutsideHolds
from jupyterhub_gpupool.pool.placement import Slot
from jupyterhub_gpupool.pool.pricing import ModelPrice, Prices
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.poolconfig import PoolConfig
from tests.allocrig import (
    A100,
    CATALOG,
    H100,
    apply_all,
    decided,
    granted,
    h100_node,
    offers,
    pool,
    queued,
    refusal,
    req,
    rows_of,
    state_of,
)
from tests.allocrig import lease as facts

FILE = {o.name: "file" for o in offers()}
PLACES = {o.name: i for i, o in enumerate(offers())}


def load(alloc: Allocator, config: PoolConfig, **rows) -> tuple:
    """The effects of loading ``config`` over rows ``rows`` (checked to change nothing)."""
    leases = rows.pop("leases", {})
    state = {"config_rows": ConfigRows(**rows), "leases": leases}
    return decided(alloc, c.LoadConfig(config), **state).effects


def test_the_files_offers_are_written_an_admins_kept_and_requests_for_a_removed_one_cancelled():
    old = parse_offer({"name": "old", "kind": "gpu", "models": ["H100-80GB"]}, CATALOG)
    alloc = Allocator([h100_node(n=1)], [*offers(), old])
    granted(alloc.submit(req("held", "old"), 1.0))
    queued(alloc.submit(req("q1", "old", "v"), 1.0))
    h100, shared = offers()[2], offers()[4]
    effects = load(
        alloc,
        PoolConfig(offers=(h100, shared)),
        offers={**FILE, "shared": "api", "old": "file"},
        positions={**PLACES, "old": 5},
        queued=(facts("q1", "queued", offer="old"),),
    )
    assert effects == (
        OfferLoaded(h100, 0),  # the file's row follows the file; the admin's "shared" stays
        OfferDropped("a100-1g"),
        OfferDropped("a100-3g"),
        OfferDropped("h100x2"),
        OfferDropped("old"),
        OffersOrdered(("h100", "shared")),
        LeaseNoted("q1", "the offer 'old' was removed from the pool"),
        LeaseReleased("q1", "cancelled", "queued"),
        PricesLoaded(Prices()),
        ConfigLoaded(2, 0),
    )
    apply_all(alloc, effects)
    assert list(alloc.offers) == ["h100", "shared"]
    assert alloc.nodes["h"].cpu_used == 0  # the lease of an offer gone counts nothing
    assert list(alloc.waiters) == [] and list(alloc.leases) == ["held"]
    assert list(alloc._demand_weights) == ["h100", "shared"]


def test_an_offer_changed_recounts_its_leases_nodes():
    alloc = pool()
    granted(alloc.submit(req("r", "h100"), 1.0))
    bigger = parse_offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"],
                          "cpu_milli": 8000}, CATALOG)  # fmt: skip
    config = PoolConfig(offers=(bigger, *offers()[:2], *offers()[3:]))
    effects = load(alloc, config, offers=FILE, positions=PLACES)
    order = ("h100", "a100-1g", "a100-3g", "h100x2", "shared")
    assert effects[:6] == (
        OfferLoaded(bigger, 0),
        *(OfferLoaded(o, i) for i, o in enumerate(config.offers[1:], 1)),
        OffersOrdered(order),
    )
    apply_all(alloc, effects)
    assert tuple(alloc.offers) == order and alloc.offers["h100"] is bigger
    assert alloc.nodes["h"].cpu_used == 8000
    fresh = Allocator([n for n in pool().nodes.values()], config.offers)
    fresh.restore(alloc.leases["r"])
    assert state_of(alloc) == state_of(fresh)


def test_the_files_quotas_are_written_or_dropped_where_no_admin_set_one():
    spec, other = QuotaSpec(Fraction(1)), QuotaSpec(Fraction(2))
    alloc = pool(QuotaBook(users={"cy": spec}))
    effects = load(
        alloc,
        PoolConfig(users={"ann": spec, "bob": spec}, groups={"lab": other}, default=other),
        quotas={("user", "bob"): "api", ("user", "cy"): "file", ("group", "x"): "api"},
    )
    quotas = [e for e in effects if isinstance(e, FileQuotaLoaded)]
    assert quotas == [
        FileQuotaLoaded("user", "ann", spec),
        FileQuotaLoaded("group", "lab", other),
        FileQuotaLoaded("default", "*", other),
        FileQuotaLoaded("user", "cy", None),
    ]
    apply_all(alloc, effects)
    book = alloc.quotas
    assert (book.users, book.groups, book.default_user) == ({"ann": spec}, {"lab": other}, other)


def test_a_quota_lowered_makes_the_leases_beyond_it_borrowed():
    alloc = pool(QuotaBook(users={"u": QuotaSpec(Fraction(2), Fraction(4))}))
    granted(alloc.submit(req("r1", "h100", arrival=1.0), 1.0))
    granted(alloc.submit(req("r2", "h100", arrival=2.0), 2.0))
    low = QuotaSpec(Fraction(1), Fraction(4))
    effects = load(alloc, PoolConfig(users={"u": low}), quotas={("user", "u"): "file"})
    assert [e for e in effects if isinstance(e, BorrowedChanged)] == [BorrowedChanged("r2", True)]
    apply_all(alloc, effects)
    assert (alloc.leases["r1"].borrowed, alloc.leases["r2"].borrowed) == (False, True)


def h(i: int, **kw) -> Gpu:
    return Gpu(f"n-H{i}", i, H100, **kw)


def whole(gpu: str, lid: str, user: str = "u") -> object:
    from jupyterhub_gpupool.pool.decisions import Lease

    request = Request(lid, user, "h100" if "H" in gpu else "a100")
    return Lease(lid, request, request.offer, "n", (Slot(gpu, "gpu"),), Fraction(1), None, False)


def test_a_declared_node_loses_the_leases_on_its_switched_gpus_before_and_vanished_ones_after():
    a100 = parse_offer({"name": "a100", "kind": "gpu", "models": ["A100-80GB"]}, CATALOG)
    table = (*offers(), a100)
    was = Node("n", gpus=[h(0), Gpu("n-A1", 1, A100), h(2)])
    room = QuotaBook(default_user=QuotaSpec(Fraction(4), Fraction(8)))
    alloc = Allocator([was], [*offers(), a100], room)
    for gpu, lid in (("n-H0", "kept"), ("n-A1", "sw"), ("n-H2", "gone")):
        alloc.restore(whole(gpu, lid))  # type: ignore[arg-type]
    rows = rows_of(alloc, "n")
    node = Node("n", gpus=[h(0), Gpu("n-A1", 1, A100, mig_enabled=True), h(3)])
    effects = load(
        alloc,
        PoolConfig(offers=table, nodes=(node,)),
        offers={o.name: "file" for o in table},
        nodes={"n": rows},
        owners={"n-H0": "n", "n-A1": "n", "n-H2": "n"},
        leases={lid: facts(lid) for lid in ("kept", "sw", "gone")},
    )
    put = replace(node, gpus=[replace(g, node="n") for g in node.gpus])
    assert effects[len(table) + 1 :] == (
        LeaseReleased("sw", "node-lost", "active"),
        LeaseReleased("gone", "node-lost", "active"),
        NodeDeclared(put, ((), (), ()), OutsideHolds()),
        ConfigLoaded(6, 1),
    )
    apply_all(alloc, effects)
    fresh = Allocator([put], [*offers(), a100], QuotaBook(default_user=room.default_user))
    fresh.restore(whole("n-H0", "kept"))  # type: ignore[arg-type]
    assert state_of(alloc) == state_of(fresh)


def test_a_new_declared_node_ends_nothing_and_serves_the_queue():
    alloc = Allocator([h100_node(n=1)], offers())
    granted(alloc.submit(req("held", "h100"), 1.0))
    queued(alloc.submit(req("waits", "h100", "v"), 2.0))
    node = Node("new", gpus=[Gpu("new-H0", 0, H100)])
    effects = load(alloc, PoolConfig(offers=tuple(offers()), nodes=(node,)), offers=FILE)
    put = replace(node, gpus=[replace(node.gpus[0], node="new")])
    assert effects[-3] == NodeDeclared(put, ((),), OutsideHolds())
    grant = effects[-2]
    assert isinstance(grant, LeaseGranted) and grant.grant.request.id == "waits"
    assert grant.grant.node == "new" and effects[-1] == ConfigLoaded(5, 1)
    apply_all(alloc, effects)
    assert alloc.leases["waits"].node == "new" and not alloc.waiters


def test_a_declared_gpu_s_layout_keeps_held_instances_and_gives_up_blocked_creations():
    gpu = Gpu("n-A0", 0, A100, mig_enabled=True, dynamic_mig=True)
    alloc = Allocator([Node("n", gpus=[gpu])], offers())
    made = granted(alloc.submit(req("made", "a100-1g"), 1.0))
    start = made.slots[0].start
    busy = {"profile": "7g.80gb", "start": 0, "uuid": "MIG-busy", "processes": 2}
    rows = rows_of(alloc, "n", **{"observed:n-A0": (busy,), "made": "granted"})
    node = Node("n", gpus=[replace(gpu, node="")])
    effects = load(
        alloc,
        PoolConfig(offers=tuple(offers()), nodes=(node,)),
        offers=FILE,
        nodes={"n": rows},
        owners={"n-A0": "n"},
        leases={"made": facts("made", "granted")},
    )
    declared = next(e for e in effects if isinstance(e, NodeDeclared))
    # the grant's instance can never be made under the busy one: given up, it goes with its
    # grant; the busy instance the pool does not want stays held until the node destroys it
    assert declared.rows == ((),)
    assert declared.node.gpus[0].instances == [MigInstance("7g.80gb", 0, "MIG-busy", RETIRING)]
    failed = next(e for e in effects if isinstance(e, MigFailed))
    assert (failed.lease_id, failed.error, failed.start) == ("made", "Occupied", start)
    assert effects.index(failed) > effects.index(declared)
    assert LeaseReleased("made", "mig-failed", "granted") in effects
    apply_all(alloc, effects)
    assert not alloc.leases and alloc.gpus["n-A0"].instances == declared.node.gpus[0].instances


EUR = Prices("EUR", {"H100-80GB": ModelPrice(Decimal(3), Decimal(3))})


def test_a_currency_change_under_recorded_prices_is_refused():
    rows = ConfigRows(currencies=frozenset({"USD"}))
    with pytest.raises(ConfigError, match="recorded prices are in USD") as refused:
        decided(pool(), c.LoadConfig(PoolConfig(prices=EUR)), config_rows=rows)
    assert refused.value.field == "prices.currency"
    same = ConfigRows(currencies=frozenset({"EUR"}))
    effects = decided(pool(), c.LoadConfig(PoolConfig(prices=EUR)), config_rows=same).effects
    assert PricesLoaded(EUR) in effects


def test_a_gpu_of_another_node_is_refused_unless_a_node_before_in_the_file_gave_it_up():
    took = Node("b", gpus=[Gpu("a-H0", 0, H100)])
    e = refusal(pool(), c.LoadConfig(PoolConfig(nodes=(took,))), config_rows=ConfigRows(
        owners={"a-H0": "a"}))  # fmt: skip
    assert (e.code, e.field) == ("gpu_elsewhere", "uuid")
    assert "belongs to node a" in str(e)
    gave = Node("a", gpus=[Gpu("a-H1", 1, H100)])
    alloc = Allocator([Node("a", gpus=[Gpu("a-H0", 0, H100)])], offers())
    effects = load(
        alloc,
        PoolConfig(nodes=(gave, took)),
        owners={"a-H0": "a"},
        nodes={"a": rows_of(alloc, "a")},
    )
    assert [e.node.name for e in effects if isinstance(e, NodeDeclared)] == ["a", "b"]
    apply_all(alloc, effects)
    assert (alloc.gpus["a-H0"].node, alloc.gpus["a-H1"].node) == ("b", "a")
    assert list(alloc.gpus) == ["a-H1", "a-H0"]  # node by node, as a rebuild lists them


def test_an_invalid_declared_node_is_refused():
    twice = Node("n", gpus=[h(0), replace(h(1), uuid="n-H0")])
    with pytest.raises(ConfigError):
        decided(pool(), c.LoadConfig(PoolConfig(nodes=(twice,))), config_rows=ConfigRows())
