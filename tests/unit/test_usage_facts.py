"""Usage from facts placed in time (issue 32): busy time per lease and hour as the samples come
(each GPU of a multi-GPU lease once; MIG without utilization busy from memory and processes,
estimated), a finished month that reads byte-identically forever, and one rounding rule under
which every format and every grouping of a range agree.

The expected figures are worked out by hand from the chargeback docs' definitions."""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpupool import orm, report
from jupyterhub_gpupool.cli import main
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.usage import CLOSE_GRACE
from jupyterhub_gpupool.service.ingest import ingest
from jupyterhub_gpupool.service.scopes import ADMIN
from jupyterhub_gpupool.service.serialize.usage import usage_report_json
from jupyterhub_gpupool.service.utilization import Sample, UtilizationBuffer
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import (
    BILL_POOL,
    InProcessService,
    StoreClock,
    make_instances,
    make_store,
    request,
    write_pool,
)

POOL = BILL_POOL
PRICES = BILL_POOL["prices"]
ADMINS = {"admin": {"kind": "user", "name": "admin", "scopes": [ADMIN], "groups": []}}
NOV, DEC = datetime(2026, 11, 1), datetime(2026, 12, 1)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "source"
XSRF = re.compile(rb'<meta name="gpupool-xsrf" content="[^"]*">')
PRICE_TABLE = re.compile(rb'<table id="price-table">.*?</table>', re.S)
BY = ("user", "group", "offer")


class Pool:
    """A store and the service's sample path (buffer → ingest → writer's ``add_busy``)."""

    def __init__(self, url: str, clock: StoreClock) -> None:
        self.url, self.clock = url, clock
        self.store = make_store(url, clock, pool=POOL)
        self.buffer = UtilizationBuffer(window=86400)

    def hold(self, user: str, offer: str, group: str | None = None) -> LeaseView:
        groups = (group,) if group else ()
        lease = self.store.allocate(user, "", offer, group=group, groups=groups)
        assert lease.state == "granted", lease
        if offer.startswith("a100"):
            make_instances(self.store)
        self.store.keepalive(lease.id)
        return lease

    def sample(
        self, lease: LeaseView, util: float | None, memory: int = 0, procs: int | None = None
    ):
        """One sample of each of the lease's devices at the clock's time."""
        ts = epoch(self.clock())
        batch = [Sample(ts, s.gpu, s.start, util, memory, procs) for s in lease.slots]
        return self.store.add_busy(ingest(self.store, self.buffer, batch, 5.0))

    def run(self, lease: LeaseView, minutes: int, **sample) -> None:
        """Sample the lease's devices every minute for ``minutes`` (the clock moves on)."""
        for _ in range(minutes):
            self.clock.advance(minutes=1)
            self.sample(lease, **sample)


@pytest.fixture
def pool(db_url, clock):
    upgrade(db_url)
    return Pool(db_url, clock)


def row(store, start, end, by, key):
    """The figures of the usage row ``key`` grouped ``by``."""
    [r] = [r for r in store.usage(start, end, by) if r.key == key]
    return r.figures


# -- facts placed in time ---------------------------------------------------------------------


def test_each_gpu_of_a_two_gpu_lease_is_counted_once(pool, clock):
    # two H100s busy for 2 h: the lease is busy 2 h, i.e. 4 unit-hours (it holds 2 units);
    # the 8 counted the busy seconds of each GPU and then multiplied by 2 again
    t0 = clock()
    lease = pool.hold("ann", "h100x2")
    pool.sample(lease, util=90.0)
    pool.run(lease, 120, util=90.0)
    pool.store.release(lease.id)
    r = row(pool.store, t0, clock(), "user", "ann")
    assert r.held == 4
    assert r.busy == 4 and r.estimated == 0
    assert r.cost == Decimal("6.00")  # 4 busy unit-hours at 1.50
    with pool.store.read() as db:  # the lease's running total (what-if replays read it)
        assert db.get(orm.LeaseRow, lease.id).busy_hours == pytest.approx(2.0)


def test_one_busy_gpu_of_two_is_half_the_lease(pool, clock):
    t0 = clock()
    lease = pool.hold("ann", "h100x2")
    gpus = [s.gpu for s in lease.slots]
    for m in range(61):  # the first GPU busy, the second idle, for an hour
        clock.now = t0 + timedelta(minutes=m)
        ts = epoch(clock())
        batch = [Sample(ts, gpus[0], None, 80.0, 0), Sample(ts, gpus[1], None, 0.0, 0)]
        pool.store.add_busy(ingest(pool.store, pool.buffer, batch, 5.0))
    pool.store.release(lease.id)
    r = row(pool.store, t0, clock(), "user", "ann")
    assert (r.held, r.busy) == (2, 1)
    assert r.cost == Decimal("3.50")  # 1 idle unit-hour at 2 + 1 busy at 1.50


def test_a100_slices_are_busy_by_memory_and_processes_and_it_is_marked_estimated(pool, clock):
    # 1g.10gb is 1/7 of an A100; NVML has no utilization for it. 30 min with a process and
    # memory held (what the reclaim rules call in use), then 30 min with neither (idle)
    t0 = clock()
    lease = pool.hold("bob", "a100-1g")
    pool.sample(lease, util=None, memory=0, procs=0)
    pool.run(lease, 30, util=None, memory=9000, procs=1)
    pool.run(lease, 30, util=None, memory=0, procs=0)
    pool.store.release(lease.id)
    r = row(pool.store, t0, clock(), "user", "bob")
    assert r.held == Decimal("0.142857")  # 1/7
    assert r.busy == Decimal("0.071429") == r.estimated  # 0.5/7
    # idle 0.071428 at 3 + busy 0.071429 at 2: 0.214284 + 0.142858 = 0.357142 → 0.36
    assert r.cost == Decimal("0.36")


def test_busy_time_is_placed_in_the_hour_it_happened(pool, clock):
    # a lease held 23:00 → 01:00 across the month end, busy only in its first half hour
    clock.now = datetime(2026, 10, 31, 23, 0)
    lease = pool.hold("ann", "h100")
    pool.sample(lease, util=90.0)
    pool.run(lease, 30, util=90.0)
    pool.run(lease, 90, util=0.0)
    pool.store.release(lease.id)
    octo = row(pool.store, datetime(2026, 10, 1), NOV, "user", "ann")
    nov = row(pool.store, NOV, DEC, "user", "ann")
    assert (octo.held, octo.busy) == (1, Decimal("0.5"))
    assert (nov.held, nov.busy) == (1, 0)  # not half of it
    # and a range that cuts an hour gets the share of its busy time it holds of the hour
    half = row(pool.store, datetime(2026, 10, 31, 23, 0), datetime(2026, 10, 31, 23, 15),
               "user", "ann")  # fmt: skip
    assert (half.held, half.busy) == (Decimal("0.25"), Decimal("0.125"))


def test_a_closed_month_takes_no_late_fact(pool, clock):
    clock.now = datetime(2026, 11, 30, 23, 0)
    lease = pool.hold("ann", "h100")
    last_hour = datetime(2026, 11, 30, 23, 0)
    clock.now = DEC + CLOSE_GRACE - timedelta(seconds=1)  # still open: a backlog is taken
    assert pool.store.add_busy({(lease.id, last_hour): (60.0, 0.0)}) == 0
    clock.now = DEC + CLOSE_GRACE  # closed now: dropped
    assert pool.store.add_busy({(lease.id, last_hour): (60.0, 0.0)}) == 1
    assert row(pool.store, NOV, DEC, "user", "ann").busy == Decimal("0.016667")  # 60 s


# -- a finished month reads identically forever ----------------------------------------------


def november(pool: Pool, clock: StoreClock) -> dict[str, str]:
    """A November: a lease from October, a MIG slice in no group, users in two groups, a lease
    still running across the month end."""
    clock.now = datetime(2026, 10, 31, 23, 0)
    ann = pool.hold("ann", "h100", "ml")
    pool.sample(ann, util=90.0)
    pool.run(ann, 30, util=90.0)
    clock.now = datetime(2026, 11, 1, 1, 0)
    pool.store.release(ann.id)
    clock.now = datetime(2026, 11, 10, 9, 0)
    bob = pool.hold("bob", "a100-1g")
    pool.sample(bob, util=None, procs=0)
    pool.run(bob, 40, util=None, memory=4000, procs=1)
    pool.run(bob, 20, util=None, memory=0, procs=0)
    pool.store.release(bob.id)
    cem = pool.hold("cem", "a100-3g", "cv")
    clock.advance(minutes=200)
    pool.store.release(cem.id)
    clock.now = datetime(2026, 11, 30, 22, 0)
    dan = pool.hold("dan", "h100x2", "ml")
    pool.sample(dan, util=50.0)
    pool.run(dan, 150, util=50.0)  # into December, still running
    return dan


def readings(pool: Pool, tmp_path, name: str) -> dict[str, bytes]:
    """November as every format says it: the API's JSON and CSV per grouping, the report's CSV
    and HTML files (the command, on the database), and the panel's page."""
    out: dict[str, bytes] = {}
    q = f"from={NOV.isoformat()}Z&to={DEC.isoformat()}Z"
    with InProcessService(pool.store, ADMINS) as api:
        for by in BY:
            out[f"json-{by}"] = api.call("admin", "GET", f"usage?by={by}&{q}").body
            out[f"csv-{by}"] = api.call("admin", "GET", f"usage?by={by}&format=csv&{q}").body
            page = request("GET", f"{api.url}/admin/usage?{q}&by={by}", "admin")
            # less the session's XSRF token (random per session) and the price table over
            # time (it grows with every change; the prices November used are listed above it)
            assert page.status == 200
            out[f"panel-{by}"] = PRICE_TABLE.sub(b"", XSRF.sub(b"", page.body))
    pool_file = write_pool(tmp_path, yaml.safe_dump(POOL), name=f"pool-{name}.yaml")
    for fmt in ("csv", "html"):
        target = tmp_path / f"{name}.{fmt}"
        args = ["report", "--month", "2026-11", "--format", fmt, "--db-url", pool.url,
                "--pool-config", str(pool_file), "-o", str(target)]  # fmt: skip
        assert main(args) == 0
        out[f"report-{fmt}"] = target.read_bytes()
    return out


def test_november_reads_byte_identically_after_december_happens(pool, clock, tmp_path):
    dan = november(pool, clock)
    clock.now = DEC + CLOSE_GRACE + timedelta(minutes=30)
    first = readings(pool, tmp_path, "first")
    # December: the lease across the boundary goes on busy, new leases come and go, an agent's
    # backlog brings busy time for November's last hour (too late: dropped), prices change
    pool.run(dan, 60, util=95.0)
    repriced = {**PRICES, "models": {"H100-80GB": 7, "A100-80GB": {"held": 1, "busy": 0.5}}}
    make_store(pool.url, clock, pool={**POOL, "prices": repriced})  # a restart, new prices
    assert pool.store.add_busy({(dan.id, datetime(2026, 11, 30, 23, 0)): (600.0, 0.0)}) == 1
    eve = pool.hold("eve", "h100", "ml")
    pool.sample(eve, util=80.0)
    pool.run(eve, 45, util=80.0)
    pool.store.release(eve.id)
    clock.now = datetime(2026, 12, 20, 12, 0)
    pool.store.release(dan.id)
    second = readings(pool, tmp_path, "second")
    assert second == first
    assert row(pool.store, DEC, clock(), "user", "dan").cost > 0  # December moved


# -- one rounding rule: every format and grouping agrees ------------------------------------------


PANEL_ROW = re.compile(r'<tr data-key="([^"]*)" data-kind="([^"]*)">(.*?)</tr>', re.S)
PANEL_CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)


def test_every_total_is_the_sum_of_its_rows_in_every_format_and_grouping(pool, clock, tmp_path):
    november(pool, clock)
    clock.now = DEC + CLOSE_GRACE
    seen = readings(pool, tmp_path, "agree")
    report_rows = list(csv.DictReader(io.StringIO(seen["report-csv"].decode())))
    totals = set()
    for by in BY:
        body = yaml.safe_load(seen[f"json-{by}"])
        items, total = body["items"], body["total"]
        # every total is the sum of the rows as shown
        for col in ("held_unit_hours", "busy_unit_hours", "estimated_busy_unit_hours", "cost"):
            shown = sum((Decimal(str(i[col])) for i in items), Decimal(0))
            assert shown == Decimal(str(total[col])), (by, col)
        totals.add((total["cost"], total["held_unit_hours"], total["busy_unit_hours"]))
        # the API's CSV: the JSON's rows
        rows = list(csv.DictReader(io.StringIO(seen[f"csv-{by}"].decode())))
        assert [(r[by], r["kind"], r["cost"]) for r in rows] == [
            (i[by], i["kind"], i["cost"]) for i in items
        ]
        # the report's CSV section: the same rows, "(no group)" its own kind, then the total
        section = [r for r in report_rows if r["section"] == by]
        assert [(r["name"], r["cost"], r["held_unit_hours"]) for r in section[:-1]] == [
            (i[by], i["cost"], str(i["held_unit_hours"])) for i in items
        ]
        assert section[-1]["kind"] == "total" and section[-1]["cost"] == total["cost"]
        # the panel's table: the same names, costs and total
        panel = seen[f"panel-{by}"].decode()
        cells = [PANEL_CELL.findall(body) for _, _, body in PANEL_ROW.findall(panel)]
        assert [c[-1] for c in cells] == [i["cost"] for i in items]
        assert f'<td class="cost">{total["cost"]}</td></tr></tfoot>' in panel
        # the report's HTML: the section's total row
        assert f'<td class="n">{total["cost"]}</td></tr></tbody>' in seen["report-html"].decode()
    assert len(totals) == 1  # the same total whatever the grouping
    groups = yaml.safe_load(seen["json-group"])["items"]
    assert [(g["group"], g["kind"]) for g in groups] == [
        ("cv", "group"),
        ("ml", "group"),
        ("(no group)", "no-group"),
    ]
    assert [r["kind"] for r in report_rows if r["name"] == "(no group)"] == ["no-group"]
    assert report.UNBOUND_NOTE in seen["report-csv"].decode()


def docs_example() -> list[list[str]]:
    """The worked example's table in the chargeback how-to, as rows of cells."""
    page = (DOCS / "howto" / "chargeback.md").read_text()
    part = page[page.index("### A worked example") :]
    table = re.search(r"^\| user \|.*?\n\n", part, re.S | re.M)
    assert table is not None
    lines = table.group(0).strip().splitlines()[2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_the_worked_example_of_the_docs(pool, clock):
    """docs/source/howto/chargeback.md, "A worked example": its table is what the service says
    for that month, row by row and in total, and by group the same total."""
    november(pool, clock)
    clock.now = DEC + CLOSE_GRACE
    body = usage_report_json(pool.store.usage_report(NOV, DEC, "user"))  # as the API shows it
    cols = ("held_unit_hours", "busy_unit_hours", "estimated_busy_unit_hours", "cost")
    got = [[i["user"], *(str(i[c]) for c in cols)] for i in body["items"]]
    got.append(["total", *(str(body["total"][c]) for c in cols)])
    assert got == docs_example()
    groups = pool.store.usage_report(NOV, DEC, "group")
    assert [(g.key, g.kind, g.figures.cost) for g in groups.items] == [
        ("cv", "group", Decimal("5.00")),
        ("ml", "group", Decimal("8.00")),
        ("(no group)", "no-group", Decimal("0.33")),
    ]
    assert groups.total.cost == Decimal(body["total"]["cost"]) == Decimal("13.33")
