"""Small domain rules the store applies: budget periods and offer priority."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import Offer, offer_priority, parse_offer
from jupyterhub_gpupool.pool.quota import PERIODS, period_start


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("now", "period", "start"),
    [
        (at(2024, 3, 13, 15, 42, 7, 123), "day", at(2024, 3, 13)),
        (at(2024, 3, 13), "day", at(2024, 3, 13)),
        (at(2024, 3, 13, 23, 59, 59, 999999), "day", at(2024, 3, 13)),
        # ISO weeks start on Monday: 2024-03-11 is a Monday, 2024-03-17 a Sunday
        (at(2024, 3, 13, 8), "week", at(2024, 3, 11)),
        (at(2024, 3, 11), "week", at(2024, 3, 11)),
        (at(2024, 3, 17, 23, 59), "week", at(2024, 3, 11)),
        (at(2024, 3, 18, 0, 0, 1), "week", at(2024, 3, 18)),
        (at(2024, 3, 1, 12), "week", at(2024, 2, 26)),  # back over a month end
        (at(2021, 1, 1, 12), "week", at(2020, 12, 28)),  # and over a year end
        (at(2024, 3, 13, 15), "month", at(2024, 3, 1)),
        (at(2024, 3, 1), "month", at(2024, 3, 1)),
        (at(2024, 2, 29, 23), "month", at(2024, 2, 1)),
        (at(2024, 12, 31, 23, 59), "month", at(2024, 12, 1)),
    ],
)
def test_period_start(now, period, start):
    assert period_start(now, period) == start


@pytest.mark.parametrize("period", PERIODS)
def test_period_start_keeps_the_time_zone_and_contains_now(period):
    now = at(2024, 7, 4, 18, 30)
    start = period_start(now, period)
    assert start.tzinfo is timezone.utc
    assert start <= now
    assert period_start(start, period) == start  # a period's start is in that period
    # the store's naive UTC datetimes give the same instants
    naive = period_start(now.replace(tzinfo=None), period)
    assert naive.tzinfo is None
    assert naive == start.replace(tzinfo=None)


def offer(priority_class: str) -> Offer:
    return Offer(name="h100", kind="gpu", priority_class=priority_class)


@pytest.mark.parametrize(
    ("priority_class", "priority"),
    [("low", -10), ("default", 0), ("high", 10), ("5", 5), ("-3", -3), ("urgent", 0)],
)
def test_offer_priority(priority_class, priority):
    assert offer(priority_class).priority == priority
    assert offer_priority(offer(priority_class)) == priority


def test_offer_priority_defaults():
    assert Offer(name="x", kind="cpu").priority == 0
    assert offer_priority(None) == 0  # the request's offer is no longer configured
    parsed = parse_offer({"name": "h", "kind": "gpu", "priority_class": "high"}, default_catalog())
    assert parsed.priority == 10
