"""Capacity planning and the what-if replay on a synthetic month recorded through the real
store, whose answers are known by construction.

The month: one node with one H100. Every day at 09:00 three users ask for it; each holds it
for one hour (half of it busy) and stops. So the recorded waits are 0, 60 and 120 min each day
(p50 60, p95 120 by nearest rank). With one more H100 they would have been 0, 0 and 60 (p95 60);
with two more, all 0. With the node removed, nothing is served.
"""

from __future__ import annotations

import json
from copy import deepcopy
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction

import pytest
import yaml

from jupyterhub_gpupool.cli import main
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.headroom import Headroom, headroom_for
from jupyterhub_gpupool.pool.model import Gpu, Node, parse_offer
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.reclaimpolicy import PolicySet
from jupyterhub_gpupool.pool.usage import busy_from
from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES, TRAINING
from jupyterhub_gpupool.service.scopes import ADMIN, USE
from jupyterhub_gpupool.service.serialize.mig import mig_plan_json
from jupyterhub_gpupool.simulate.whatif import (
    Change,
    WhatIfError,
    recorded,
    replay,
    summarize,
    what_if,
)
from jupyterhub_gpupool.store.planning import Record
from jupyterhub_gpupool.store.read.planning import WaitFigures, nearest_rank, wait_figures
from tests.fakes import InProcessService, StoreClock, make_store, write_pool

POOL = {
    "nodes": [
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 1}]},
    ],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {"default": {"guarantee": 1, "limit": 1}},
    "reclaim": {"default": {"idle_timeout": "1h", "pressure_idle_timeout": "20m"}},
}  # fmt: skip
DAY1 = datetime(2026, 11, 1)
CATALOG = default_catalog()
UNTIL = datetime(2026, 12, 1)


def record_month(url: str, days: int = 30, *, reclaimed: bool = False):
    upgrade(url)
    clock = StoreClock(DAY1)
    store = make_store(url, clock, pool=POOL)
    for d in range(days):
        clock.now = DAY1 + timedelta(days=d, hours=9)
        leases = [store.allocate(f"user{i}", "", "h100") for i in range(3)]
        assert [x.state for x in leases] == ["granted", "queued", "queued"]
        for _ in leases:  # the fair queue picks who is next: whoever is granted goes
            [lease] = [x for x in leases if store.lease(x.id).state == "granted"]
            store.keepalive(lease.id)
            store.add_busy(busy_from(lease.id, store.clock(), 0.5))
            clock.advance(hours=1)
            reason = "reclaimed-idle" if reclaimed else "stopped"
            store.release(lease.id, reason=reason)  # the next one is granted now
    clock.now = UNTIL
    return store


@pytest.fixture(scope="module")
def month(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('month')}/pool.sqlite"
    return url, record_month(url)


def test_nearest_rank():
    assert nearest_rank([0, 60, 120], 0.5) == 60
    assert nearest_rank([0, 60, 120], 0.95) == 120
    assert nearest_rank([0, 0, 60], 0.5) == 0
    assert nearest_rank([], 0.5) is None


def test_wait_figures_in_minutes_to_a_tenth():
    assert wait_figures([30, 90, 3600, 7263]) == WaitFigures(p50_min=1.5, p95_min=121.0)
    assert wait_figures([]) == WaitFigures(None, None)


def test_capacity_per_offer_and_day(month):
    _, store = month
    days = store.capacity(DAY1, UNTIL)
    assert len(days) == 30 and {d.offer for d in days} == {"h100"}
    first = days[0]
    assert first.day == datetime(2026, 11, 1) and first.requests == 3
    assert days[1].day == datetime(2026, 11, 2)
    assert first.held_unit_hours == 3.0 and first.busy_unit_hours == 1.5
    assert first.idle_share == 0.5
    # waiting: one request 1 h, one 2 h → 3 unit-hours waited; demand = held + waited
    assert first.waiting_unit_hours == 3.0 and first.demand_unit_hours == 6.0
    assert first.waits == WaitFigures(p50_min=60.0, p95_min=120.0)
    assert first.queued_for_capacity == 2 and first.queued_for_quota == 0
    assert (first.refused_by_quota, first.refused_by_capacity) == (0, 0)


def test_capacity_tells_quota_from_capacity(tmp_path):
    url = f"sqlite:///{tmp_path}/q.sqlite"
    upgrade(url)
    clock = StoreClock(DAY1 + timedelta(hours=9))
    store = make_store(url, clock, pool={**POOL, "nodes": [
        {**POOL["nodes"][0], "gpus": [{"model": "H100-80GB", "count": 2}]}]})  # fmt: skip
    store.allocate("ann", "one", "h100")
    second = store.allocate("ann", "two", "h100")  # free GPU, but ann's limit is 1
    assert second.state == "queued" and second.reason == "quota"
    [day] = store.capacity(DAY1, DAY1 + timedelta(days=1))
    assert day.queued_for_quota == 1 and day.queued_for_capacity == 0


def test_what_if_more_gpus_shortens_the_waits_as_constructed(month):
    _, store = month
    base = what_if(store, 30, Change(), UNTIL)["offers"]["h100"]
    assert base["recorded"]["requests"] == base["what_if"]["requests"] == 90
    # the recorded pool, replayed, reproduces what happened
    for key in ("wait_p50_min", "wait_p95_min", "served", "held_unit_hours", "idle_share"):
        assert base["what_if"][key] == base["recorded"][key], key
    assert base["recorded"]["wait_p50_min"] == 60.0 and base["recorded"]["wait_p95_min"] == 120.0
    one = what_if(store, 30, Change(add={"H100-80GB": 1}), UNTIL)["offers"]["h100"]["what_if"]
    assert (one["wait_p50_min"], one["wait_p95_min"]) == (0.0, 60.0)
    two = what_if(store, 30, Change(add={"H100-80GB": 2}), UNTIL)["offers"]["h100"]["what_if"]
    assert (two["wait_p50_min"], two["wait_p95_min"]) == (0.0, 0.0)
    assert two["held_unit_hours"] == 90.0 and two["idle_share"] == 0.5  # the same work
    week = what_if(store, 7, Change(add={"H100-80GB": 2}), UNTIL)["offers"]["h100"]
    assert week["recorded"]["requests"] == 21


def test_what_if_without_the_node_serves_nothing(month):
    _, store = month
    gone = what_if(store, 30, Change(remove=("h100",)), UNTIL)["offers"]["h100"]["what_if"]
    assert gone["served"] == 0 and gone["unserved"] == 90


def test_what_if_a_shorter_idle_timeout_releases_reclaimed_leases_sooner(tmp_path):
    from jupyterhub_gpupool.pool.reclaimpolicy import parse_policies

    store = record_month(f"sqlite:///{tmp_path}/r.sqlite", days=3, reclaimed=True)
    offers = store.locked().__enter__().offers
    shorter = parse_policies({"default": {"idle_timeout": "30m", "pressure_idle_timeout": "20m",
                                          "warn_before": "10m"}}, offers)  # fmt: skip
    r = what_if(store, 3, Change(policy=shorter), datetime(2026, 11, 4))["offers"]["h100"]
    # each lease was reclaimed after a 1 h idle timeout: with 30 min it ends 30 min sooner,
    # so the waits are 0, 30 and 60 min and half as many unit-hours are held
    assert (r["what_if"]["wait_p50_min"], r["what_if"]["wait_p95_min"]) == (30.0, 60.0)
    assert r["what_if"]["held_unit_hours"] == 4.5 and r["recorded"]["held_unit_hours"] == 9.0


def test_too_few_days_says_how_many_there_are(month):
    _, store = month
    with pytest.raises(
        WhatIfError, match=r"holds 30 days .*since 2026-11-01.*ask for 30 days or fewer"
    ):
        what_if(store, 31, Change(), UNTIL)


def test_the_command_prints_the_side_by_side_table(month, capsys):
    url, _ = month
    rc = main(["simulate", "what-if", "--from", url, "--days", "30", "--until",
               "2026-12-01T00:00:00Z", "--add", "H100-80GB:2"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "+2 H100-80GB" in out
    [row] = [line for line in out.splitlines() if line.startswith("h100")]
    assert "60 → 0" in row and "120 → 0" in row
    rc = main(["simulate", "what-if", "--from", url, "--until", "2026-12-01", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["days"] == 30


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--days", "45"], "holds 30 days"),
        (["--add", "H100-80GB"], "MODEL:COUNT"),
        (["--add", "H900:1"], "unknown GPU model 'H900'"),
        (["--remove", "gpu-z"], "no node 'gpu-z' (nodes: h100)"),
        (["--until", "yesterday"], "--until must be an ISO 8601 time"),
        (["--days", "0"], "--days must be at least 1"),
        (["--policy", "/nonexistent.yaml"], "cannot read /nonexistent.yaml"),
    ],
)
def test_bad_what_if_input_is_one_line_exit_2(month, args, says, capsys):
    url, _ = month
    rc = main(["simulate", "what-if", "--from", url, "--until", "2026-12-01", *args])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1, err


def test_a_bad_policy_file_names_the_field(month, tmp_path, capsys):
    url, _ = month
    bad = write_pool(tmp_path, yaml.safe_dump({"reclaim": {"offers": {"nope": {}}}}))
    rc = main(["simulate", "what-if", "--from", url, "--until", "2026-12-01", "--policy", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "reclaim.offers" in err and "nope" in err


# -- the same through the API (what the admin panel calls) ------------------------------------

MODELS = {
    "admin": {"kind": "user", "name": "admin", "scopes": [ADMIN], "groups": []},
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
}


def test_capacity_and_what_if_over_http(month):
    _, store = month
    with InProcessService(store, MODELS) as api:
        r = api.call("admin", "GET", "capacity?from=2026-11-01&to=2026-11-03&offer=h100")
        assert r.status == 200 and [d["day"] for d in r.json()["items"]] == [
            "2026-11-01",
            "2026-11-02",
        ]
        body = {"days": 30, "add": {"H100-80GB": 2}, "until": "2026-12-01T00:00:00Z"}
        r = api.call("admin", "POST", "capacity/what-if", body)
        assert r.status == 200, r.body
        side = r.json()["offers"]["h100"]
        assert side["recorded"]["wait_p95_min"] == 120.0 and side["what_if"]["wait_p95_min"] == 0
        short = {"days": 30, "until": "2026-12-01", "reclaim": {"default": {"idle_timeout": "1h"}}}
        assert api.call("admin", "POST", "capacity/what-if", short).status == 200
        for bad, field, says in [
            ({"days": 40, "until": "2026-12-01"}, "days", "holds 30 days"),
            ({"days": 0}, "days", "from 1 to 366"),
            ({"days": 5, "add": {"H900": 1}}, "add", "unknown GPU model"),
            ({"days": 5, "remove": ["gpu-z"]}, "remove", "no node"),
            ({"days": 5, "reclaim": {"offers": {"nope": {}}}}, "reclaim.offers", "nope"),
            ({"days": 5, "mig_layout": {"h100": "static"}}, "mig_layout", "dynamic"),
            ({"days": 5, "mig_layout": {"gpu-z": "dynamic"}}, "mig_layout", "no node"),
        ]:
            r = api.call("admin", "POST", "capacity/what-if", bad)
            err = r.json()["error"]
            assert r.status == 400 and err["field"] == field and says in err["message"], err
        assert api.call("alice", "POST", "capacity/what-if", {"days": 1}).status == 403
        assert api.call("alice", "GET", "capacity").status == 403


# -- a different MIG layout ---------------------------------------------------------------------

MIG_POOL = {
    "nodes": [
        {"name": "a100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}]},
    ],
    "offers": [{"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]}],
    "quotas": {"default": {"guarantee": 1, "limit": 1}},
}  # fmt: skip


def test_what_if_a_fixed_mig_layout(tmp_path, capsys):
    """Three 3g.40gb asks a day for an hour each on a dynamic A100 (room for two at once):
    waits 0, 0, 60. Fixed to one 3g.40gb (and smaller slices) the A100 serves one at a time:
    0, 60, 120; with the recorded dynamic layout the replay says what happened."""
    from tests.fakes import make_instances

    url = f"sqlite:///{tmp_path}/mig.sqlite"
    upgrade(url)
    clock = StoreClock(DAY1)
    store = make_store(url, clock, pool=MIG_POOL)
    for d in range(3):
        clock.now = DAY1 + timedelta(days=d, hours=9)
        leases = [store.allocate(f"user{i}", "", "a100-3g") for i in range(3)]
        for _ in range(3):  # the node's agent: destroy what was released, make what is planned
            gone = [a | {"ok": True, "error": None} for a in mig_plan_json(store.mig_plan("a100"))]
            store.mig_results("a100", [a for a in gone if a["op"] == "destroy"])
            make_instances(store)
            live = [x for x in leases if store.lease(x.id).state == "granted"]
            for lease in live:
                store.keepalive(lease.id)
            clock.advance(hours=1)
            for lease in live:
                store.release(lease.id)
        assert all(store.lease(x.id).state == "released" for x in leases)
    clock.now = datetime(2026, 11, 4)
    same = what_if(store, 3, Change(layouts={"a100": "dynamic"}))["offers"]["a100-3g"]
    assert same["recorded"]["wait_p95_min"] == same["what_if"]["wait_p95_min"] == 60.0
    fixed = Change(layouts={"a100": ("3g.40gb", "2g.20gb", "1g.10gb")})
    one = what_if(store, 3, fixed)["offers"]["a100-3g"]["what_if"]
    assert (one["wait_p50_min"], one["wait_p95_min"]) == (60.0, 120.0)
    rc = main(["simulate", "what-if", "--from", url, "--days", "3", "--until", "2026-11-04",
               "--mig-layout", "a100=3g.40gb,3g.40gb,3g.40gb"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit one A100-80GB" in err and err.count("\n") == 1
    rc = main(["simulate", "what-if", "--from", url, "--days", "3", "--until", "2026-11-04",
               "--mig-layout", "a100=9g.90gb"])  # fmt: skip
    assert rc == 2 and "9g.90gb" in capsys.readouterr().err


# -- requests refused outright -----------------------------------------------------------------


def test_refusals_by_quota_and_by_capacity_are_counted_per_offer_and_day(tmp_path):
    url = f"sqlite:///{tmp_path}/r.sqlite"
    upgrade(url)
    clock = StoreClock(DAY1 + timedelta(hours=9))
    pool = {
        **POOL,
        "offers": [
            *POOL["offers"],
            {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
            {"name": "a100", "kind": "gpu", "models": ["A100-80GB"]},
        ],
        "quotas": {**POOL["quotas"], "users": {"bob": {"limit": 0}}},
    }
    store = make_store(url, clock, pool=pool)
    models = {**MODELS, "bob": {"kind": "user", "name": "bob", "scopes": [f"{USE}!user=bob"]}}
    with InProcessService(store, models) as api:
        for who, offer, code in (
            ("bob", "h100", "no_quota"),  # refused by his quota
            ("bob", "h100", "no_quota"),
            ("alice", "h100x2", "exceeds_node_size"),  # no node has two H100s
            ("alice", "a100", "no_such_hardware"),  # no A100 in the pool
            ("alice", "nope", "unknown_offer"),  # a malformed ask: not counted
        ):
            r = api.call(who, "POST", "allocations", {"offer": offer, "server": ""})
            assert r.status in (403, 422) and r.json()["error"]["code"] == code, r.body
        clock.advance(days=1)
        assert api.call("bob", "POST", "allocations", {"offer": "h100"}).status == 422  # quota
        r = api.call("admin", "GET", "capacity?from=2026-11-01&to=2026-11-03")
    rows = {(d["offer"], d["day"]): d for d in r.json()["items"]}
    assert rows[("h100", "2026-11-01")]["refused_by_quota"] == 2
    assert rows[("h100", "2026-11-02")]["refused_by_quota"] == 1
    assert rows[("h100x2", "2026-11-01")]["refused_by_capacity"] == 1
    assert rows[("a100", "2026-11-01")]["refused_by_capacity"] == 1
    assert rows[("a100", "2026-11-01")]["refused_by_quota"] == 0
    assert not any(offer == "nope" for offer, _ in rows)
    assert store.record_refusal("h100", "invalid_field") is False  # not a planning figure


def test_a_refusal_count_is_one_row_per_day_offer_and_code(db_url):
    upgrade(db_url)
    clock = StoreClock(DAY1 + timedelta(hours=9))
    store = make_store(db_url, clock, pool=POOL)
    for _ in range(3):
        assert store.record_refusal("h100", "exceeds_limit")
    assert store.record_refusal("h100", "no_such_hardware")
    [day] = store.capacity(DAY1, DAY1 + timedelta(days=1))
    assert (day.refused_by_quota, day.refused_by_capacity) == (3, 1)
    assert day.requests == 0  # refusals are not requests with a lease
    assert day.waits == WaitFigures(None, None)  # no request: no wait


# -- a new install: less than a day recorded, said in words ------------------------------------


def test_a_new_install_says_in_words_what_the_replay_needs_and_takes_hours(tmp_path):
    """Fresh: the replay needs an hour of requests; with 5 hours recorded, 30 days asked says
    "5 hours … ask for 5 hours or fewer" (never "0 days … 1 or fewer", never a CLI flag), and
    ``hours`` replays them; the what-if page's own line says the same."""
    from jupyterhub_gpupool.service.pages.governance import recorded_words

    url = f"sqlite:///{tmp_path}/pool.sqlite"
    upgrade(url)
    start = datetime(2026, 12, 5, 8, 10)
    clock = StoreClock(start)
    store = make_store(url, clock, pool=POOL)
    with pytest.raises(WhatIfError) as e:
        what_if(store, 30, Change())
    assert str(e.value) == (
        "no request has been recorded yet: the replay needs at least one hour of recorded requests"
    )
    assert recorded_words(None, clock())[1:] == ("hours", 1)
    lease = store.allocate("alice", "", "h100")
    store.keepalive(lease.id)
    clock.advance(minutes=20)
    with pytest.raises(WhatIfError) as e:
        what_if(store, 1, Change())
    assert str(e.value) == (
        "the database holds less than an hour of recorded requests (since 2026-12-05 08:10 UTC);"
        " the replay needs at least one hour of them: ask again after 09:10 UTC"
    )
    clock.advance(hours=5)
    store.allocate("bob", "", "h100")  # waits for alice's: within the last 5 hours
    store.release(lease.id)
    clock.advance(minutes=1)
    for days in (1, 30):
        with pytest.raises(WhatIfError) as e:
            what_if(store, days, Change())
        assert e.value.field == "days"
        assert str(e.value) == (
            f"the database holds 5 hours of recorded requests (since 2026-12-05 08:10 UTC), "
            f"fewer than the {days} day{'s' if days > 1 else ''} asked: ask for 5 hours or fewer"
        )
    with pytest.raises(WhatIfError) as e:
        what_if(store, 0, Change(), hours=6)
    assert e.value.field == "hours" and "ask for 5 hours or fewer" in str(e.value)
    result = what_if(store, 0, Change(), hours=5)
    assert (result["days"], result["hours"]) == (None, 5)
    assert result["offers"]["h100"]["recorded"]["requests"] == 1
    words, unit, span = recorded_words(store.first_request(), clock())
    assert words == "The database holds 5 hours of requests, since 2026-12-05 08:10 UTC."
    assert (unit, span) == ("hours", 5)
    with InProcessService(store, MODELS) as api:
        r = api.call("admin", "POST", "capacity/what-if", {"days": 30})
        err = r.json()["error"]
        assert r.status == 400 and err["field"] == "days"
        assert "ask for 5 hours or fewer" in err["message"] and "--" not in err["message"]
        r = api.call("admin", "POST", "capacity/what-if", {"hours": 5})
        assert r.status == 200 and r.json()["hours"] == 5, r.body
        for bad, field in (
            ({"days": 1, "hours": 1}, "hours"),
            ({}, "days"),
            ({"hours": 0}, "hours"),
        ):
            r = api.call("admin", "POST", "capacity/what-if", bad)
            assert r.status in (400, 422) and r.json()["error"]["field"] == field, r.body


# -- the headroom (borrowing: {keep_free}) ------------------------------------------------------


def kept_day() -> tuple[list, list, list, QuotaBook]:
    """Two H100s; two borrowed trainings (0:00 for 2 h, 0:10 for 30 min) and a notebook (1:00 for
    2 h), as recorded with no headroom: nobody waited."""
    h100 = CATALOG.model("H100-80GB")
    nodes = [Node("n", gpus=[Gpu(f"n-{i}", i, h100) for i in range(2)])]
    offers = [parse_offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}, CATALOG)]

    def rec(rid: str, user: str, at: float, hours: float, workload: str | None) -> Record:
        asked = DAY1 + timedelta(hours=at)
        return Record(
            rid, user, f"s-{rid}", "h100", None, (), (), 0 if workload is None else -50, asked,
            asked, asked + timedelta(hours=hours), 1.0, hours / 2, "stopped", None, workload,
        )  # fmt: skip

    records = [
        rec("t1", "trainer", 0, 2, TRAINING),
        rec("t2", "trainer", 1 / 6, 0.5, TRAINING),
        rec("nb", "alice", 1, 2, None),
    ]
    book = QuotaBook(users={"alice": QuotaSpec(guarantee=Fraction(1))})
    return records, nodes, offers, book


def test_the_replay_keeps_the_headroom_and_counts_who_waited_for_it():
    records, nodes, offers, book = kept_day()
    end = DAY1 + timedelta(days=1)
    policy = PolicySet()

    def run(headroom):
        out = replay(records, deepcopy(nodes), offers, book, DAY1, end, old_policy=policy,
                     headroom=headroom)  # fmt: skip
        return sorted((o["wait"], o["for_headroom"]) for o in out), summarize(out)["*"]

    waits, figures = run(None)
    assert waits == [(0.0, False)] * 3 and figures["headroom_waits"] == 0  # nobody waits
    # keeping one: t2 would take the last GPU and waits (headroom); the notebook finds the
    # kept one at 1:00; t1 ends at 2:00 (one free: still kept), the notebook at 3:00: t2 runs
    waits, figures = run(headroom_for(Headroom(1), DEFAULT_CLASSES))
    assert waits == [(0.0, False), (0.0, False), (3 * 3600 - 600.0, True)]
    assert figures["headroom_waits"] == 1 and figures["served"] == 3
    # what happened is read from the queued events' reasons
    assert summarize(recorded(records, DAY1, end))["*"]["headroom_waits"] == 0
    held_back = [records[0], replace(records[1], waited_for="headroom"), records[2]]
    assert summarize(recorded(held_back, DAY1, end))["*"]["headroom_waits"] == 1


def test_what_if_says_the_headroom_setting_and_its_waits(month, capsys):
    url, store = month
    result = what_if(store, 30, Change(keep_free=Headroom(1)), UNTIL)
    assert result["headroom"] == {"configured": "none", "what_if": "keep_free 1"}
    assert result["change"] == "borrowing keep_free 1"
    # the month is notebooks only: nothing borrowed by training, nothing held back
    assert result["offers"]["h100"]["what_if"]["headroom_waits"] == 0
    rc = main(["simulate", "what-if", "--from", url, "--until", "2026-12-01",
               "--keep-free", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "headroom (borrowing): none → keep_free 2; requests that waited for it: 0 → 0" in out
    plain = main(["simulate", "what-if", "--from", url, "--until", "2026-12-01"])
    assert plain == 0 and "headroom" not in capsys.readouterr().out
    assert Headroom(0, {"H100-80GB": 3, "A100-80GB": 0}).describe() == "keep_free H100-80GB 3"
