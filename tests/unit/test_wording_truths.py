"""The small truths a user and an admin read (issue 31): a capacity wait names the offer by
its display name and gives an estimate once releases exist (and otherwise says why there is
none), a lease's last hour is a real figure, counts read "1 minute" / "2 minutes"."""

from __future__ import annotations

from datetime import datetime

from jupyterhub_gpupool.pool.codes import describe
from jupyterhub_gpupool.store.read.utilization import MinuteView
from jupyterhub_gpupool.wording import estimate_text, last_hour_text, plural, wait_text

H100 = "1× H100 80GB"


def test_a_capacity_wait_reads_waiting_for_a_free_offer():
    text = wait_text("no_capacity", "no 1× H100 80GB is free now", H100)
    assert text == "waiting for a free 1× H100 80GB"
    # what the queue once showed: the meaning of the catch-all code
    assert describe("no_capacity").meaning not in text
    assert (
        wait_text("quota", "over your limit", H100)
        == "waiting for room in the quota: over your limit"
    )
    assert wait_text("fairness", "x", H100).startswith("waiting: the free 1× H100 80GB is kept")


def test_the_estimate_once_releases_exist_and_why_none_before():
    assert estimate_text(None, H100) == "none yet: no 1× H100 80GB was released in the last hour"
    # two releases in the last hour, second in line: 2 * 3600 / 2 s (pool/queue.estimate_wait)
    assert estimate_text(3600.0, H100) == "about 60 min"
    assert estimate_text(20.0, H100) == "about 1 min"
    assert estimate_text(3 * 3600.0, H100) == "about 3 h"


def _minute(util: float | None, memory: int) -> MinuteView:
    return MinuteView(datetime(2026, 1, 1), "GPU-a", None, 6, util, util, memory)


def test_the_last_hour_is_a_real_figure():
    minutes = [_minute(0.0, 100), _minute(60.0, 100), _minute(30.0, 100)]
    assert last_hour_text(minutes) == "mean 30 %, peak 60 % over 3 minutes"
    mig = [_minute(None, 2048)]
    assert last_hour_text(mig) == "memory up to 2.0 GiB over 1 minute (no utilization)"
    assert last_hour_text([]) == "no readings yet"


def test_counts_read_naturally():
    assert [plural(n, "unit") for n in (0, 1, 2)] == ["0 units", "1 unit", "2 units"]
