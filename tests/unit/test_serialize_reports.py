"""The reports' JSON (``service/serialize/usage.py``, ``planning.py``, ``budgets.py``) against
JSON written out by hand: every wire name, number type and time text of ``GET usage``, ``GET
usage/idle-holders``, ``GET capacity`` and a budget warning. The views cross the writer's
process pipe, so they pickle; the usage builders' sums are checked on hand-made line items."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone
from decimal import Decimal
from types import SimpleNamespace

from jupyterhub_gpupool.pool.kernels import KERNEL_HOLDER
from jupyterhub_gpupool.pool.pricing import ALWAYS, ModelPrice
from jupyterhub_gpupool.pool.usage import LineItem
from jupyterhub_gpupool.pool.workloads import JOB_HOLDER
from jupyterhub_gpupool.service.serialize.budgets import budget_warning_json
from jupyterhub_gpupool.service.serialize.planning import capacity_json
from jupyterhub_gpupool.service.serialize.usage import idle_holders_json, usage_report_json
from jupyterhub_gpupool.store.read.budgets import BudgetWarningView, budget_warning_view
from jupyterhub_gpupool.store.read.planning import (
    CapacityDayView,
    DayCell,
    WaitFigures,
    capacity_day_view,
)
from jupyterhub_gpupool.store.read.usage import (
    IdleHolderView,
    PriceUsedView,
    UsageFigures,
    UsageReportView,
    UsageRowView,
    idle_holders,
    usage_report_view,
)
from jupyterhub_gpupool.store.rows import event_data

NOV = datetime(2026, 11, 1)
DEC = datetime(2026, 12, 1)

GROUP_REPORT = UsageReportView(
    start=NOV,
    end=DEC,
    by="group",
    currency="EUR",
    items=(
        UsageRowView(
            "ml",
            "group",
            UsageFigures(
                2,
                Decimal("1.333333"),
                Decimal("0.5"),
                Decimal("0.25"),
                Decimal(0),
                Decimal("2.17"),
            ),
        ),
        UsageRowView(
            "(no group)",
            "no-group",
            UsageFigures(
                1, Decimal("0.25"), Decimal(0), Decimal(0), Decimal("0.25"), Decimal("0.00")
            ),
        ),
    ),
    total=UsageFigures(
        3, Decimal("1.583333"), Decimal("0.5"), Decimal("0.25"), Decimal("0.25"), Decimal("2.17")
    ),
    prices=(
        PriceUsedView("H100-80GB", None, Decimal("2.5"), Decimal("1.5")),
        PriceUsedView("H100-80GB", datetime(2026, 11, 15), Decimal(3), Decimal("2")),
    ),
)


def test_a_usage_reports_json_rows_total_and_prices():
    assert usage_report_json(GROUP_REPORT) == {
        "from": "2026-11-01T00:00:00Z",
        "to": "2026-12-01T00:00:00Z",
        "by": "group",
        "currency": "EUR",
        "items": [
            {
                "group": "ml",
                "kind": "group",
                "leases": 2,
                "held_unit_hours": 1.333333,
                "busy_unit_hours": 0.5,
                "estimated_busy_unit_hours": 0.25,
                "idle_unit_hours": 0.833333,
                "idle_share": 0.625,
                "unpriced_unit_hours": 0.0,
                "cost": "2.17",
            },
            {
                "group": "(no group)",
                "kind": "no-group",
                "leases": 1,
                "held_unit_hours": 0.25,
                "busy_unit_hours": 0.0,
                "estimated_busy_unit_hours": 0.0,
                "idle_unit_hours": 0.25,
                "idle_share": 1.0,
                "unpriced_unit_hours": 0.25,
                "cost": "0.00",
            },
        ],
        "total": {
            "leases": 3,
            "held_unit_hours": 1.583333,
            "busy_unit_hours": 0.5,
            "estimated_busy_unit_hours": 0.25,
            "idle_unit_hours": 1.083333,
            "idle_share": 0.6842,
            "unpriced_unit_hours": 0.25,
            "cost": "2.17",
        },
        "prices": [
            {"model": "H100-80GB", "from": None, "held": "2.5", "busy": "1.5"},
            {"model": "H100-80GB", "from": "2026-11-15T00:00:00Z", "held": "3", "busy": "2"},
        ],
    }


def test_a_job_rows_json_names_the_job_and_nothing_held_has_no_share():
    nothing = UsageFigures(0, Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal("0.00"))
    view = UsageReportView(
        NOV,
        DEC,
        "job",
        "USD",
        (
            UsageRowView("job:j1", "job", nothing, "train"),
            UsageRowView("(servers)", "no-job", nothing, ""),
        ),
        nothing,
        (),
    )
    body = usage_report_json(view)
    assert [(i["job"], i["kind"], i["name"]) for i in body["items"]] == [
        ("job:j1", "job", "train"),
        ("(servers)", "no-job", ""),
    ]
    assert list(body["items"][0]) == [
        "job", "kind", "leases", "held_unit_hours", "busy_unit_hours",
        "estimated_busy_unit_hours", "idle_unit_hours", "idle_share", "unpriced_unit_hours",
        "cost", "name",
    ]  # fmt: skip
    assert body["total"]["idle_share"] == 0.0 and body["prices"] == []


def test_idle_holders_json():
    views = (IdleHolderView("ida", 2, Decimal("1.5"), Decimal("0.25"), Decimal("3.13")),)
    assert idle_holders_json(views) == [
        {
            "user": "ida",
            "leases": 2,
            "held_unit_hours": 1.5,
            "busy_unit_hours": 0.25,
            "idle_unit_hours": 1.25,
            "idle_share": 0.8333,
            "idle_cost": "3.13",
        }
    ]


def lease(user: str, group: str | None, offer: str, holder: str = "", server: str = ""):
    """What the usage builders read of a lease row."""
    return SimpleNamespace(user=user, group=group, offer=offer, holder=holder, server=server)


def item(held: str, busy: str, cost: str, idle_cost: str = "0", prices=()) -> LineItem:
    return LineItem(
        Decimal(held), Decimal(busy), Decimal(0), Decimal(0), Decimal(cost), Decimal(idle_cost),
        prices,
    )  # fmt: skip


def test_the_builders_sum_rows_and_total_the_rows_as_shown():
    first = (("H100-80GB", ALWAYS, ModelPrice(Decimal(1), Decimal(1))),)
    second = (("H100-80GB", NOV, ModelPrice(Decimal(2), Decimal(1))),)
    lines = [
        (lease("ann", "ml", "h100"), item("0.333333", "0", "0.33", "0.33", first)),
        (lease("bob", "ml", "h100"), item("0.333333", "0.1", "0.33", "0.23", second)),
        (lease("cem", None, "h100"), item("0.333333", "0.333333", "0.33")),
        (lease("dan", None, "h100", JOB_HOLDER, "job:j9"), item("1", "0", "1.00", "1.00")),
    ]  # fmt: skip
    view = usage_report_view(lines, start=NOV, end=DEC, by="group", currency="EUR")
    assert [(r.key, r.kind, r.figures.leases, r.figures.cost) for r in view.items] == [
        ("ml", "group", 2, Decimal("0.66")),
        ("(no group)", "no-group", 2, Decimal("1.33")),
    ]
    assert view.items[0].figures.held == Decimal("0.666666") and view.items[0].name is None
    assert view.total == UsageFigures(
        4, Decimal("1.999999"), Decimal("0.433333"), Decimal(0), Decimal(0), Decimal("1.99")
    )
    assert view.prices == (
        PriceUsedView("H100-80GB", None, Decimal(1), Decimal(1)),
        PriceUsedView("H100-80GB", NOV, Decimal(2), Decimal(1)),
    )
    jobs = usage_report_view(lines, start=NOV, end=DEC, by="job", currency="EUR",
                             names={"job:j9": "sweep"})  # fmt: skip
    assert [(r.key, r.kind, r.name) for r in jobs.items] == [
        ("job:j9", "job", "sweep"),
        ("(servers)", "no-job", ""),
    ]
    by_kernel = usage_report_view(
        [(lease("eve", None, "h100", KERNEL_HOLDER, "kernel:k1"), item("1", "1", "1.00"))],
        start=NOV, end=DEC, by="kernel", currency="EUR",
    )  # fmt: skip
    assert [(r.key, r.kind) for r in by_kernel.items] == [("kernel:k1", "kernel")]
    assert [(h.user, h.idle, h.idle_cost) for h in idle_holders(lines, 10)] == [
        ("dan", Decimal(1), Decimal("1.00")),
        ("ann", Decimal("0.333333"), Decimal("0.33")),
        ("bob", Decimal("0.233333"), Decimal("0.23")),
    ]  # cem was busy throughout: not listed
    assert [h.user for h in idle_holders(lines, 1)] == ["dan"]


DAY = CapacityDayView(
    offer="h100",
    day=datetime(2026, 11, 3),
    requests=3,
    demand_unit_hours=6.5,
    held_unit_hours=3.25,
    busy_unit_hours=1.5,
    waiting_unit_hours=3.25,
    idle_share=0.5385,
    waits=WaitFigures(60.0, 120.5),
    queued_for_quota=1,
    queued_for_capacity=2,
    refused_by_quota=4,
    refused_by_capacity=0,
)


def test_a_capacity_days_json():
    assert capacity_json([DAY]) == [
        {
            "offer": "h100",
            "day": "2026-11-03",
            "requests": 3,
            "demand_unit_hours": 6.5,
            "held_unit_hours": 3.25,
            "busy_unit_hours": 1.5,
            "waiting_unit_hours": 3.25,
            "idle_share": 0.5385,
            "wait_p50_min": 60.0,
            "wait_p95_min": 120.5,
            "queued_for_quota": 1,
            "queued_for_capacity": 2,
            "refused_by_quota": 4,
            "refused_by_capacity": 0,
        }
    ]


def test_a_day_cell_becomes_its_view_rounded():
    cell = DayCell(requests=2, held=1.0000004, busy=0.25, waiting=0.5, waits=[60.0, 3600.0])
    cell.quota += 1
    assert capacity_day_view("a100-1g", datetime(2026, 11, 3), cell, (0, 2)) == CapacityDayView(
        "a100-1g", datetime(2026, 11, 3), 2, 1.5, 1.0, 0.25, 0.5, 0.75, WaitFigures(1.0, 60.0),
        1, 0, 0, 2,
    )  # fmt: skip
    empty = capacity_day_view("a100-1g", datetime(2026, 11, 4), DayCell(), (1, 0))
    assert (empty.idle_share, empty.waits) == (0.0, WaitFigures(None, None))
    assert capacity_json([empty])[0]["wait_p50_min"] is None


WARNING = {
    "subject": "group",
    "name": "ml",
    "level": 80,
    "used_unit_hours": 8.000001,
    "budget": 10.0,
    "period": "month",
    "period_start": datetime(2026, 11, 1, tzinfo=timezone.utc),  # as pool.decide answers it
    "action": "stop",
}


def test_a_budget_warning_is_typed_and_its_json_is_the_audit_events():
    view = budget_warning_view(WARNING)
    assert view == BudgetWarningView("group", "ml", 80, 8.000001, 10.0, "month", NOV, "stop")
    assert view.period_start.tzinfo is None
    assert budget_warning_json(view) == {
        "subject": "group",
        "name": "ml",
        "level": 80,
        "used_unit_hours": 8.000001,
        "budget": 10.0,
        "period": "month",
        "period_start": "2026-11-01T00:00:00Z",
        "action": "stop",
    }
    assert list(budget_warning_json(view)) == list(WARNING)  # the hook's keyword order
    assert budget_warning_json(view) == event_data(WARNING)  # the audit event's data


def test_the_report_views_pickle():
    holders = (IdleHolderView("ida", 2, Decimal("1.5"), Decimal("0.25"), Decimal("3.13")),)
    warning = budget_warning_view(WARNING)
    for view in (GROUP_REPORT, holders, DAY, warning):
        again = pickle.loads(pickle.dumps(view))
        assert again == view
    assert pickle.loads(pickle.dumps(GROUP_REPORT)).total.cost == Decimal("2.17")
