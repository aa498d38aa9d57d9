"""A pool config's load decided by ``pool.decide`` (``pool.rules.config``): the rows it writes,
what its removals end, what it refuses, as effects; the allocator is rebuilt from the rows
after (``AllocatorRebuilt``), so the decision leaves it as it was."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.effects import (
    AllocatorRebuilt,
    ConfigLoaded,
    FileQuotaLoaded,
    LeaseNoted,
    LeaseReleased,
    NodeDeclared,
    OfferDropped,
    OfferLoaded,
    PricesLoaded,
)
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.facts import ConfigRows, GpuRows
from jupyterhub_gpupool.pool.model import Gpu, Node
from jupyterhub_gpupool.pool.pricing import ModelPrice, Prices
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.poolconfig import PoolConfig
from tests.allocrig import A100, H100, decided, offers, pool, refusal
from tests.allocrig import lease as facts


def load(config: PoolConfig, **rows) -> tuple:
    """The effects of loading ``config`` over rows ``rows`` (checked to change nothing)."""
    return decided(pool(), c.LoadConfig(config), config_rows=ConfigRows(**rows)).effects


def test_the_files_offers_are_written_an_admins_kept_and_requests_for_a_removed_one_cancelled():
    h100, shared = offers()[2], offers()[4]
    effects = load(
        PoolConfig(offers=(h100, shared)),
        offers={"h100": "file", "shared": "api", "old": "file", "mine": "api"},
        queued=(
            facts("q1", "queued", offer="old"),
            facts("q2", "queued", offer="mine"),
            facts("q3", "queued", offer="h100"),
        ),
    )
    assert effects == (
        OfferLoaded(h100, 0),  # the file's row follows the file; the admin's "shared" stays
        OfferDropped("old"),
        LeaseNoted("q1", "the offer 'old' was removed from the pool"),
        LeaseReleased("q1", "cancelled", "queued"),
        PricesLoaded(Prices()),
        ConfigLoaded(2, 0),
        AllocatorRebuilt(),
    )


def test_the_files_quotas_are_written_or_dropped_where_no_admin_set_one():
    spec, other = QuotaSpec(Fraction(1)), QuotaSpec(Fraction(2))
    effects = load(
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


def h(i: int, **kw) -> Gpu:
    return Gpu(f"n-H{i}", i, H100, **kw)


def test_a_declared_node_loses_the_leases_on_its_switched_gpus_before_and_vanished_ones_after():
    node = Node("n", gpus=[h(0), Gpu("n-A1", 1, A100, mig_enabled=True), h(3)])
    both = facts("both", "granted")  # holds a switched GPU and a vanished one: ends once
    effects = load(
        PoolConfig(nodes=(node,)),
        gpus={
            "n": (
                GpuRows("n-H0", False, (facts("kept"),)),
                GpuRows("n-A1", False, (facts("sw"), both)),
                GpuRows("n-H2", False, (both, facts("gone", "reclaiming"))),
            )
        },
        owners={"n-H0": "n", "n-A1": "n"},
    )
    assert effects[1:-2] == (
        LeaseReleased("sw", "node-lost", "active"),
        LeaseReleased("both", "node-lost", "granted"),
        NodeDeclared(node),
        LeaseReleased("gone", "node-lost", "reclaiming"),
    )
    assert effects[-2:] == (ConfigLoaded(0, 1), AllocatorRebuilt())


def test_a_new_declared_node_ends_nothing():
    node = Node("new", gpus=[Gpu("new-H0", 0, H100)])
    assert load(PoolConfig(nodes=(node,)))[1:] == (
        NodeDeclared(node),
        ConfigLoaded(0, 1),
        AllocatorRebuilt(),
    )


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
    rows = ConfigRows(owners={"a-H0": "a"})
    effects = decided(pool(), c.LoadConfig(PoolConfig(nodes=(gave, took))), config_rows=rows)
    assert [e for e in effects.effects if isinstance(e, NodeDeclared)] == [
        NodeDeclared(gave),
        NodeDeclared(took),
    ]


def test_an_invalid_declared_node_is_refused():
    twice = Node("n", gpus=[h(0), replace(h(1), uuid="n-H0")])
    with pytest.raises(ConfigError):
        decided(pool(), c.LoadConfig(PoolConfig(nodes=(twice,))), config_rows=ConfigRows())
