"""Chargeback: prices in the pool config, costs in ``GET usage`` (JSON and CSV agree to the
cent under the one rounding rule), the top idle holders, and the monthly report command."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from decimal import Decimal

import pytest
import yaml

from jupyterhub_gpupool import report
from jupyterhub_gpupool.cli import main
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.pricing import Prices, cents, parse_prices
from jupyterhub_gpupool.pool.usage import busy_from
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.service.scopes import ADMIN, USE
from jupyterhub_gpupool.store import chargeback
from tests.fakes import (
    STORE_POOL,
    InProcessService,
    StoreClock,
    make_instances,
    make_store,
    write_pool,
)

PRICES = {"currency": "EUR", "models": {"H100-80GB": 1, "A100-80GB": {"held": 3, "busy": 2}}}
POOL = {**STORE_POOL, "prices": PRICES}
MODELS = {
    "admin": {"kind": "user", "name": "admin", "scopes": [ADMIN], "groups": []},
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
}
NOV = datetime(2026, 11, 1)


def models() -> list[str]:
    return default_catalog().names


# -- the prices --------------------------------------------------------------------------------


def test_prices_parse_held_and_a_lower_busy_price():
    p = parse_prices(PRICES, models())
    assert p.currency == "EUR"
    assert p.models["H100-80GB"].held == p.models["H100-80GB"].busy == Decimal(1)
    assert p.cost("A100-80GB", Decimal("2"), Decimal("0.5")) == Decimal("5.5")  # 1.5×3 + 0.5×2
    assert p.cost("T4", Decimal(1), Decimal(0)) is None  # unpriced
    assert parse_prices(None, models()) == Prices()


@pytest.mark.parametrize(
    ("raw", "field", "code"),
    [
        ({"models": {"A100-90GB": 1}}, "prices.models.A100-90GB", "unknown_gpu_model"),
        ({"models": {"H100-80GB": -1}}, "prices.models.H100-80GB", "invalid_config"),
        ({"models": {"H100-80GB": "cheap"}}, "prices.models.H100-80GB", "invalid_config"),
        ({"models": {"H100-80GB": {"held": 1, "busy": 2}}}, "prices.models.H100-80GB.busy", None),
        ({"models": {"H100-80GB": {"busy": 2}}}, "prices.models.H100-80GB", None),
        ({"currency": "€"}, "prices.currency", None),
        ({"cost": 1}, "prices", None),
    ],
)
def test_a_bad_price_is_refused_naming_the_field(raw, field, code):
    with pytest.raises(ConfigError) as e:
        parse_pool_config({"prices": raw}, default_catalog())
    assert e.value.field == field
    if code:
        assert e.value.code == code
    if code == "unknown_gpu_model":
        assert "A100-80GB" in (e.value.allowed or [])


def test_one_rounding_rule_half_up_to_the_cent():
    assert cents(Decimal("0.005")) == Decimal("0.01")
    assert cents(Decimal("0.004999")) == Decimal("0.00")
    assert report.COLUMNS == chargeback.COLUMNS  # the report's copy (lazy store import)


# -- the store -----------------------------------------------------------------------------------


@pytest.fixture
def store(db_url, clock):
    upgrade(db_url)
    return make_store(db_url, clock, pool=POOL)


def hold(store, clock: StoreClock, user: str, offer: str, minutes: float, busy_h: float = 0.0):
    lease = store.allocate(user, "", offer)
    if offer.startswith("a100"):
        make_instances(store)  # the dynamic-MIG node's agent makes the instance
    store.keepalive(lease.id)
    if busy_h:
        store.add_busy(busy_from(lease.id, clock(), busy_h))
    clock.advance(minutes=minutes)
    return store.release(lease.id)


def test_usage_costs_round_per_row_and_the_total_is_their_sum(store, clock):
    # three users hold the H100 (1 EUR/unit-hour) 20 min each: 0.33 each, 0.99 in all (a
    # total taken before rounding would say 1.00 and disagree with the rows)
    start = clock()
    for user in ("ann", "bob", "cem"):
        hold(store, clock, user, "h100", 20)
    body = store.usage_report(start, clock(), "user")
    assert body.currency == "EUR" and body.by == "user"
    assert [(r.key, r.kind) for r in body.items] == [
        ("ann", "user"),
        ("bob", "user"),
        ("cem", "user"),
    ]
    assert [r.figures.cost for r in body.items] == [Decimal("0.33")] * 3
    assert body.total.cost == Decimal("0.99")
    assert body.total.held == Decimal("0.999999")  # the rows as shown, added
    assert body.total.leases == 3


def test_busy_hours_cost_the_lower_price_and_unpriced_models_are_flagged(store, clock):
    # alice holds 3g.40gb (half an A100) for 2 h, busy 1 h of them: held 1 unit-hour,
    # busy 0.5: 0.5×3 + 0.5×2 = 2.50
    start = clock()
    hold(store, clock, "alice", "a100-3g", 120, busy_h=1.0)
    [row] = store.usage(start, clock(), "offer")
    assert row.key == "a100-3g" and row.kind == "offer"
    assert row.figures.held == Decimal("1.000000")
    assert row.figures.busy == Decimal("0.500000")
    assert row.figures.idle_share == 0.5
    assert row.figures.cost == Decimal("2.50") and row.figures.unpriced == 0
    # prices removed from the config: the past keeps its prices, the hours from now are unpriced
    store.load_config(parse_pool_config({**STORE_POOL, "prices": None}, default_catalog()))
    [row] = store.usage(start, clock(), "offer")
    assert row.figures.cost == Decimal("2.50") and row.figures.unpriced == 0
    lease = store.allocate("alice", "", "a100-3g")
    clock.advance(hours=2)
    store.release(lease.id)
    [row] = store.usage(start, clock(), "offer")
    assert row.figures.cost == Decimal("2.50") and row.figures.unpriced == Decimal(1)


def test_top_idle_holders_most_idle_first(store, clock):
    start = clock()
    hold(store, clock, "busy-bea", "h100", 60, busy_h=1.0)  # never idle: not listed
    hold(store, clock, "idle-ida", "h100", 90)
    hold(store, clock, "some-sam", "h100", 60, busy_h=0.5)
    holders = store.idle_holders(start, clock(), 10)
    assert [h.user for h in holders] == ["idle-ida", "some-sam"]
    assert holders[0].idle == Decimal("1.5") and holders[0].leases == 1
    assert holders[0].idle_cost == Decimal("1.50") and holders[1].idle_share == 0.5
    assert [h.user for h in store.idle_holders(start, clock(), 1)] == ["idle-ida"]


# -- the API: JSON and CSV to the cent -------------------------------------------------------


def test_api_csv_totals_equal_the_json_to_the_cent(store, clock):
    start = clock()
    for i, user in enumerate(("ann", "bob", "cem", "dan", "eve", "fay", "gus")):
        hold(store, clock, user, "h100", 7 + i, busy_h=0.01 * i)
        hold(store, clock, user, "a100-1g", 11 + 3 * i, busy_h=0.02 * i)
    q = f"from={start.isoformat()}Z&to={clock().isoformat()}Z"
    with InProcessService(store, MODELS) as api:
        for by in ("user", "group", "offer"):
            body = api.call("admin", "GET", f"usage?by={by}&{q}").json()
            r = api.call("admin", "GET", f"usage?by={by}&format=csv&{q}")
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/csv")
            rows = list(csv.DictReader(io.StringIO(r.body.decode())))
            assert [row[by] for row in rows] == [i[by] for i in body["items"]]
            csv_total = sum((Decimal(row["cost"]) for row in rows), Decimal(0))
            assert csv_total == Decimal(body["total"]["cost"]) > 0
            assert [row["cost"] for row in rows] == [i["cost"] for i in body["items"]]
        idle = api.call("admin", "GET", f"usage/idle-holders?limit=3&{q}").json()
        assert len(idle["items"]) == 3 and idle["currency"] == "EUR"
        assert api.call("alice", "GET", f"usage/idle-holders?{q}").status == 403
        bad = api.call("admin", "GET", "usage/idle-holders?limit=0")
        assert bad.status == 400 and bad.json()["error"]["field"] == "limit"


# -- the monthly report ----------------------------------------------------------------------


@pytest.fixture
def november(tmp_path):
    """A month of leases on SQLite; the pool file with the prices."""
    url = f"sqlite:///{tmp_path}/pool.sqlite"
    upgrade(url)
    clock = StoreClock(datetime(2026, 10, 31, 23, 0))
    store = make_store(url, clock, pool=POOL)
    hold(store, clock, "ann", "h100", 120)  # 1 h in October, 1 h in November
    clock.now = datetime(2026, 11, 10, 9, 0)
    hold(store, clock, "bob", "h100", 30, busy_h=0.5)
    hold(store, clock, "<b>eve</b>", "a100-3g", 60)
    return url, write_pool(tmp_path, yaml.safe_dump(POOL)), store


def test_report_csv_has_the_usage_figures_of_the_month(november, tmp_path, capsys):
    url, pool_file, store = november
    out = tmp_path / "nov.csv"
    rc = main(["report", "--month", "2026-11", "--db-url", url, "--pool-config", str(pool_file),
               "-o", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    users = {r["name"]: r for r in rows if r["section"] == "user" and r["kind"] == "row"}
    assert users["ann"]["held_unit_hours"] == "1.0" and users["ann"]["cost"] == "1.00"
    assert users["bob"]["cost"] == "0.50" and users["<b>eve</b>"]["cost"] == "1.50"
    api = store.usage_report(NOV, datetime(2026, 12, 1), "group")
    [group_total] = [r for r in rows if r["section"] == "group" and r["kind"] == "total"]
    assert group_total["cost"] == "3.00" and api.total.cost == Decimal("3.00")
    idle = [r["name"] for r in rows if r["section"] == "idle-holders"]
    assert idle == ["ann", "<b>eve</b>"]  # 1 unit-hour idle, then 0.5; bob half busy


def test_report_html_escapes_and_totals(november, capsys):
    url, pool_file, _ = november
    rc = main(["report", "--month", "2026-11", "--format", "html", "--db-url", url,
               "--pool-config", str(pool_file), "-o", "-"])  # fmt: skip
    page = capsys.readouterr().out
    assert rc == 0 and page.startswith("<!doctype html>")
    assert "November 2026" in page and "3.00 EUR" in page
    assert "&lt;b&gt;eve&lt;/b&gt;" in page and "<b>eve</b>" not in page


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--month", "2026-13"], "--month must be YYYY-MM"),
        (["--month", "Nov"], "--month must be YYYY-MM"),
        (["--month", "2026-11", "--db-url", "sqlite:////nonexistent/x.sqlite"], "no pool database"),
        (["--month", "2026-11", "--top", "0"], "--top must be at least 1"),
        (["--month", "2026-11", "--format", "pdf"], "invalid choice"),
    ],
)
def test_report_bad_input_is_one_line_exit_2(args, says, capsys):
    try:
        rc = main(["report", *args])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1


def test_report_refuses_an_unmigrated_database_and_a_bad_price(tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    assert main(["report", "--month", "2026-11", "--db-url", f"sqlite:///{empty}"]) == 2
    assert "upgrade-db" in capsys.readouterr().err
    url = f"sqlite:///{tmp_path}/ok.sqlite"
    upgrade(url)
    bad = write_pool(tmp_path, "prices: {models: {A100-90GB: 2}}\n", name="bad.yaml")
    assert main(["report", "--month", "2026-11", "--db-url", url, "--pool-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "prices.models.A100-90GB" in err and err.count("\n") == 1
