"""The fair queue: priority class, then within-guarantee before borrowing,
then lowest weighted share, then arrival; aging against starvation; wait estimates."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator, Queued
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import Gpu, Node, Request, parse_offer
from jupyterhub_gpupool.pool.queue import Waiter, estimate_wait, order_key, ordered
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec


def waiter(
    rid: str,
    *,
    priority: int = 0,
    within: bool = False,
    since: float = 0.0,
    user: str = "u",
    group: str | None = None,
) -> Waiter:
    return Waiter(
        Request(rid, user, "h100", priority=priority, group=group),
        Fraction(1),
        group,
        within,
        "no_capacity",
        since,
    )


def ids(waiters) -> list[str]:
    return [w.request.id for w in waiters]


def no_share(_w: Waiter) -> float:
    return 0.0


def shares(table: dict[str, float]):
    return lambda w: table[w.request.id]


def test_priority_comes_first():
    ws = [
        waiter("low-early-within", priority=0, within=True, since=0),
        waiter("high-late-borrowing", priority=2, within=False, since=50),
        waiter("mid", priority=1, within=True, since=10),
    ]
    share = shares({"low-early-within": 0.0, "high-late-borrowing": 9.0, "mid": 0.0})
    assert ids(ordered(ws, 60, share, aging_interval=0)) == [
        "high-late-borrowing",
        "mid",
        "low-early-within",
    ]


def test_within_guarantee_before_borrowing_at_equal_priority():
    ws = [
        waiter("borrow-early", within=False, since=0),
        waiter("within-late", within=True, since=30),
    ]
    share = shares({"borrow-early": 0.0, "within-late": 5.0})
    assert ids(ordered(ws, 60, share, aging_interval=0)) == ["within-late", "borrow-early"]


def test_lower_weighted_share_first_when_priority_and_guarantee_tie():
    ws = [
        waiter("heavy-early", since=0),
        waiter("light-late", since=40),
        waiter("middle", since=20),
    ]
    share = shares({"heavy-early": 1.5, "light-late": 0.1, "middle": 0.5})
    assert ids(ordered(ws, 60, share, aging_interval=0)) == ["light-late", "middle", "heavy-early"]


def test_arrival_breaks_the_remaining_ties_then_the_id():
    ws = [waiter("c", since=3), waiter("a", since=5), waiter("b", since=3)]
    assert ids(ordered(ws, 10, no_share, aging_interval=0)) == ["b", "c", "a"]


def test_order_key_is_smaller_for_the_one_served_first():
    first = waiter("x", priority=1)
    second = waiter("y", priority=0)
    assert order_key(first, 0, no_share, 0) < order_key(second, 0, no_share, 0)


def test_aging_lifts_an_old_low_priority_waiter_above_a_new_high_priority_one():
    old = waiter("old", priority=0, since=0)
    new = waiter("new", priority=3, since=250)
    interval = 100.0
    # at 250 the old one has aged two levels (2 < 3): the new one is served first
    assert ids(ordered([old, new], 250, no_share, interval)) == ["new", "old"]
    assert old.effective_priority(250, interval) == 2
    assert new.effective_priority(250, interval) == 3
    # at 299.9 still two levels (floor): no change
    assert ids(ordered([old, new], 299.9, no_share, interval)) == ["new", "old"]
    # at 300 both are at 3 (new has aged 50 s, i.e. 0 levels): the tie goes to arrival -> old
    assert old.effective_priority(300, interval) == 3
    assert new.effective_priority(300, interval) == 3
    assert ids(ordered([old, new], 300, no_share, interval)) == ["old", "new"]
    # both age, so the old one only gets strictly ahead when it has waited more than
    # 3 intervals longer: then it wins on priority alone, even against a within-guarantee ask
    newer = waiter("new", priority=3, since=500, within=True)
    assert old.effective_priority(1000, interval) == 10
    assert newer.effective_priority(1000, interval) == 8
    assert ids(ordered([old, newer], 1000, no_share, interval)) == ["old", "new"]
    # ...whereas at a tie on (aged) priority, within-guarantee still comes first
    tied = waiter("new", priority=3, since=250, within=True)
    assert ids(ordered([old, tied], 1000, no_share, interval)) == ["new", "old"]


def test_no_aging_when_the_interval_is_zero():
    old = waiter("old", priority=0, since=0)
    new = waiter("new", priority=1, since=10**6)
    assert old.effective_priority(10**9, 0) == 0
    assert ids(ordered([old, new], 10**9, no_share, aging_interval=0)) == ["new", "old"]


def test_aging_never_lowers_priority_for_a_clock_behind_since():
    w = waiter("w", priority=2, since=100)
    assert w.effective_priority(50, 10) == 2


@pytest.mark.parametrize(
    ("position", "rate", "expected"),
    [(1, 6.0, 600.0), (3, 6.0, 1800.0), (2, 0.5, 14400.0), (1, 3600.0, 1.0)],
)
def test_estimate_wait_from_the_release_rate(position, rate, expected):
    assert estimate_wait(position, rate) == pytest.approx(expected)


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_estimate_wait_is_unknown_without_releases(rate):
    assert estimate_wait(4, rate) is None


def test_estimate_grows_with_position():
    assert estimate_wait(1, 4.0) < estimate_wait(2, 4.0) < estimate_wait(5, 4.0)


# -- the same order inside the allocator, with shares from the quota book --------------------


def _full_pool(quotas: QuotaBook) -> Allocator:
    catalog = default_catalog()
    h100 = catalog.model("H100-80GB")
    node = Node("h", gpus=[Gpu("H0", 0, h100)])
    offer = parse_offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}, catalog)
    alloc = Allocator([node], [offer], quotas, aging_interval=0)
    assert alloc.submit(Request("holder", "holder", "h100"), 0).kind == "grant"
    return alloc


def test_allocator_queue_orders_by_group_share_from_the_quota_book():
    quotas = QuotaBook(
        groups={"busy": QuotaSpec(guarantee=Fraction(1)), "idle": QuotaSpec(guarantee=Fraction(4))}
    )
    quotas.add("someone", "busy", Fraction(1, 2))  # busy: share 0.5
    quotas.add("someone-else", "idle", Fraction(1))  # idle: share 0.25
    alloc = _full_pool(quotas)
    a = alloc.submit(Request("a", "alice", "h100", groups=("busy",)), 1)
    b = alloc.submit(Request("b", "bob", "h100", groups=("idle",)), 2)
    assert isinstance(a, Queued) and isinstance(b, Queued)
    assert a.position == 1
    # b arrived later but its group has used less of its guarantee: it goes first
    assert b.position == 1
    assert ids(alloc.queue(3)) == ["b", "a"]
    assert alloc.position("a", 3) == 2
    assert alloc.position("b", 3) == 1
    assert alloc.position("nobody", 3) is None


def test_allocator_queue_puts_within_guarantee_first():
    quotas = QuotaBook(users={"g": QuotaSpec(guarantee=Fraction(1))})
    alloc = _full_pool(quotas)
    first = alloc.submit(Request("borrower", "b", "h100"), 1)
    second = alloc.submit(Request("guaranteed", "g", "h100"), 2)
    assert isinstance(first, Queued) and not first.within_guarantee
    assert isinstance(second, Queued) and second.within_guarantee
    assert second.position == 1
    assert ids(alloc.queue(3)) == ["guaranteed", "borrower"]
