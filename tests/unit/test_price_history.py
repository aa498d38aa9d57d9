"""Prices with history (issue 32): each price has an effective start, every hour is priced at
the price in force then, and changing a price never changes a past hour's cost."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.pricing import ALWAYS, ModelPrice, Prices, parse_prices, reconcile
from jupyterhub_gpupool.pool.usage import busy_from
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.service.scopes import ADMIN
from jupyterhub_gpupool.store.read.usage import PriceUsedView
from tests.fakes import BILL_POOL, InProcessService, StoreClock, make_store, request

MODELS = default_catalog().names
POOL = BILL_POOL
ADMINS = {"admin": {"kind": "user", "name": "admin", "scopes": [ADMIN], "groups": []}}
BACKWARDS = [{"held": 1}, {"from": "2026-11-15", "held": 2}, {"from": "2026-11-14", "held": 3}]
P = ModelPrice


def with_prices(models: dict) -> dict:
    return {**POOL, "prices": {"currency": "EUR", "models": models}}


# -- the config: a price history per model ---------------------------------------------------


def test_a_price_history_parses_with_effective_starts():
    p = parse_prices(
        {
            "models": {
                "H100-80GB": [{"held": 2}, {"from": "2026-11-15T00:00:00Z", "held": 3, "busy": 2.5}]
            }
        },
        MODELS,
    )
    assert p.schedule["H100-80GB"] == (
        (ALWAYS, P(Decimal(2), Decimal(2))),
        (datetime(2026, 11, 15), P(Decimal(3), Decimal("2.5"))),
    )
    assert p.price_at("H100-80GB", datetime(2026, 11, 14, 23)) == (
        ALWAYS,
        P(Decimal(2), Decimal(2)),
    )
    assert p.price_at("H100-80GB", datetime(2026, 11, 15))[1].held == 3
    assert p.price_at("T4", datetime(2026, 11, 15)) is None


@pytest.mark.parametrize(
    ("entries", "field", "says"),
    [
        ([{"from": "2026-11-15T10:30:00Z", "held": 1}], "[0].from", "whole hour"),
        ([{"held": 1}, {"held": 2}], "[1].from", "needs 'from'"),
        (
            [{"held": 1}, {"from": "2026-11-15", "held": 2}, {"from": "2026-11-14", "held": 3}],
            "[2].from",
            "later than",
        ),
        ([{"from": "mid-November", "held": 1}], "[0].from", "ISO 8601"),
        ([], "", "at least one"),
        ([{"held": 1, "price": 2}], "[0]", "number or {held, busy}"),
    ],
)
def test_a_bad_price_history_is_refused_naming_the_field(entries, field, says):
    with pytest.raises(ConfigError) as e:
        parse_pool_config(with_prices({"H100-80GB": entries}), default_catalog())
    assert e.value.field == f"prices.models.H100-80GB{field}"
    assert says in str(e.value)


def test_reconcile_keeps_the_past_and_takes_a_change_from_the_next_hour():
    old = {"H100-80GB": ((ALWAYS, P(Decimal(2), Decimal(2))),)}
    new = Prices("EUR", {"H100-80GB": P(Decimal(3), Decimal(3))})
    now = datetime(2026, 11, 20, 10, 20)
    wanted, ignored = reconcile(old, new, now)
    two, three = P(Decimal(2), Decimal(2)), P(Decimal(3), Decimal(3))
    assert wanted == {"H100-80GB": ((ALWAYS, two), (datetime(2026, 11, 20, 11), three))}
    assert ignored == []
    assert reconcile(wanted, new, now) == (wanted, [])  # loading it again changes nothing
    # an entry that would reprice the past is not applied (and said)
    back = parse_prices({"models": {"H100-80GB": [{"held": 2}, {"from": "2026-11-01", "held": 5}]}},
                        MODELS)  # fmt: skip
    kept, ignored = reconcile(old, back, now)
    assert kept["H100-80GB"][:1] == old["H100-80GB"] and ignored == [
        "H100-80GB from 2026-11-01T00:00:00"
    ]
    # a model dropped from the config is unpriced from the next hour on
    gone, _ = reconcile(old, Prices("EUR"), now)
    assert gone["H100-80GB"][-1] == (datetime(2026, 11, 20, 11), None)
    # nothing recorded yet (first start, or an upgrade): the config's whole schedule
    assert reconcile({}, new, now) == ({"H100-80GB": ((ALWAYS, P(Decimal(3), Decimal(3))),)}, [])


# -- the store: each hour at the price in force then -----------------------------------------------


@pytest.fixture
def store(db_url):
    upgrade(db_url)
    clock = StoreClock(datetime(2026, 11, 14, 22, 0))
    history = [{"held": 2, "busy": 1}, {"from": "2026-11-15T00:00:00Z", "held": 4, "busy": 3}]
    return make_store(db_url, clock, pool=with_prices({"H100-80GB": history}))


def test_every_hour_is_priced_at_the_price_in_force_then(store):
    clock = store.clock
    lease = store.allocate("ann", "", "h100")
    store.keepalive(lease.id)
    store.add_busy(busy_from(lease.id, clock(), 1.0))  # 22:00–23:00 busy
    clock.advance(hours=4)  # held 22:00 → 02:00: 2 h before the change, 2 h after
    store.release(lease.id)
    body = store.usage_report(datetime(2026, 11, 1), datetime(2026, 12, 1), "user")
    [row] = body.items
    # before: 1 idle × 2 + 1 busy × 1 = 3; after: 2 idle × 4 = 8; one line item: 11.00
    assert row.figures.cost == Decimal("11.00") and row.figures.held == 4
    assert body.prices == (
        PriceUsedView("H100-80GB", None, Decimal(2), Decimal(1)),
        PriceUsedView("H100-80GB", datetime(2026, 11, 15), Decimal(4), Decimal(3)),
    )


def test_changing_a_price_never_changes_a_past_hours_cost(store, db_url):
    clock = store.clock
    lease = store.allocate("ann", "", "h100")
    store.keepalive(lease.id)
    clock.advance(hours=3)
    store.release(lease.id)  # 22:00 → 01:00: 2 h at 2, 1 h at 4 = 8.00
    clock.now = datetime(2026, 11, 20, 10, 20)
    first = store.usage_report(datetime(2026, 11, 1), datetime(2026, 11, 20, 11), "user")
    assert first.items[0].figures.cost == Decimal("8.00")
    # the admin edits the config: a new price, and an attempt at rewriting the past
    for models in (
        {"H100-80GB": 9},
        {"H100-80GB": [{"held": 7}, {"from": "2026-11-15", "held": 7}]},
    ):
        make_store(db_url, clock, pool=with_prices(models))  # a restart with the new file
        again = store.usage_report(datetime(2026, 11, 1), datetime(2026, 11, 20, 11), "user")
        assert again == first
    # the new price applies from the next whole hour (11:00), to hours that come
    later = store.allocate("bob", "", "h100")
    clock.now = datetime(2026, 11, 20, 12, 0)
    store.release(later.id)  # 10:20 → 12:00: 40 min at 4, then 1 h at 7
    [bob] = [r for r in store.usage(datetime(2026, 11, 20), clock(), "user") if r.key == "bob"]
    assert bob.figures.cost == Decimal("9.67")  # 0.666667 × 4 + 1 × 7 = 9.666668, rounded once


def test_the_api_and_panel_show_the_price_table_over_time(store, db_url):
    store.clock.now = datetime(2026, 11, 20, 10, 20)
    make_store(db_url, store.clock, pool=with_prices({"H100-80GB": 9, "A100-80GB": 3}))
    with InProcessService(store, ADMINS) as api:
        table = api.call("admin", "GET", "prices").json()
        page = request("GET", f"{api.url}/admin/usage", "admin").body.decode()
        assert api.call(None, "GET", "prices").status in (401, 403)
    assert table == {
        "currency": "EUR",
        "models": {
            "A100-80GB": [{"from": "2026-11-20T11:00:00Z", "held": "3", "busy": "3"}],
            "H100-80GB": [
                {"from": None, "held": "2", "busy": "1"},
                {"from": "2026-11-15T00:00:00Z", "held": "4", "busy": "3"},
                {"from": "2026-11-20T11:00:00Z", "held": "9", "busy": "9"},
            ],
        },
    }
    prices = page[page.index('id="price-table"') : page.index("Top idle holders")]
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td>\s*<td[^>]*>([^<]+)</td>", prices)
    assert rows == [
        ("A100-80GB", "2026-11-20T11:00:00Z", "3"),
        ("H100-80GB", "always", "2"),
        ("H100-80GB", "2026-11-15T00:00:00Z", "4"),
        ("H100-80GB", "2026-11-20T11:00:00Z", "9"),
    ]


def test_the_currency_cannot_change_under_recorded_prices(store, db_url):
    pool = {**POOL, "prices": {"currency": "USD", "models": {"H100-80GB": 2}}}
    with pytest.raises(ConfigError) as e:
        make_store(db_url, store.clock, pool=pool)
    assert e.value.field == "prices.currency" and "EUR" in str(e.value)
