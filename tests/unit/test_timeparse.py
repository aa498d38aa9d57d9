"""The one ISO 8601 reader: every zone spelling reads as the same UTC instant."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jupyterhub_gpupool.timeparse import format_epoch, format_time, parse_time

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T12:00:00Z",  # the pool's and JupyterHub's
        "2026-12-01T12:00:00.000000Z",
        "2026-12-01T12:00:00+00:00",  # Jupyter Server's
        "2026-12-01T13:00:00+01:00",
        "2026-12-01T07:00:00-05:00",
        "2026-12-01T12:00:00",  # naive: the databases' own text, read as UTC
        "2026-12-01 12:00:00",
    ],
)
def test_every_spelling_is_the_same_utc_instant(text):
    moment = parse_time(text)
    assert moment == NOON and moment.tzinfo is timezone.utc
    assert moment.timestamp() == NOON.timestamp()


def test_datetimes_pass_through_as_utc():
    assert parse_time(NOON.replace(tzinfo=None)) == NOON
    assert parse_time(NOON.astimezone(timezone(timedelta(hours=9)))).tzinfo is timezone.utc


@pytest.mark.parametrize("nothing", [None, ""])
def test_nothing_is_none(nothing):
    assert parse_time(nothing) is None
    assert parse_time(nothing, lenient=True) is None


@pytest.mark.parametrize("garbage", ["yesterday", "2026-13-01T00:00:00Z", "12:00", "1700000000"])
def test_garbage_raises_or_is_none_when_lenient(garbage):
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        parse_time(garbage)
    assert parse_time(garbage, lenient=True) is None


def test_an_offset_past_the_calendar_clamps_to_its_end():
    assert parse_time("0001-01-01T00:00:00+01:00") == datetime.min.replace(tzinfo=timezone.utc)
    assert parse_time("9999-12-31T23:59:00-01:00") == datetime.max.replace(tzinfo=timezone.utc)


def test_the_pool_writes_utc_with_a_z():
    """One text for every time the pool writes: naive (the database's UTC), aware in another
    zone, or epoch seconds; microseconds only where there are some."""
    naive = datetime(2026, 3, 2, 9, 15)
    assert format_time(naive) == "2026-03-02T09:15:00Z"
    paris = datetime(2026, 3, 2, 10, 15, 0, 250000, tzinfo=timezone(timedelta(hours=1)))
    assert format_time(paris) == "2026-03-02T09:15:00.250000Z"
    assert format_epoch(1772442900.0) == "2026-03-02T09:15:00Z"  # 20,514 days + 9 h 15 min
    assert format_epoch(1772442900.5) == "2026-03-02T09:15:00.500000Z"
    assert format_time(None) is None and format_epoch(None) is None
