"""ReclaimRound, ReclaimOutcome, NoticeEnforced, PutReclaimPolicy, ResetReclaimPolicy,
AdminReclaim, ExtendNotice, CancelNotice, EnforceNotices and BudgetRound decided by
``pool.decide``: each checked on its effects or refusal, with the allocator left as it was
(the rows the applier writes are the store tests' part: ``test_store_reclaim.py``,
``test_store_operate.py``, ``test_store_notice_cancel.py``, ``test_budgets.py``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.effects import (
    BudgetWarned,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
    NoticeGiven,
    NoticeMoved,
    NoticeWithdrawn,
    ReclaimClaimed,
    ReclaimCounted,
    ReclaimEnded,
    ReclaimPolicyReset,
    ReclaimPolicySet,
)
from jupyterhub_gpupool.pool.errors import Refusal
from jupyterhub_gpupool.pool.noticefacts import Shrinkable
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.pool.reclaim import LeaseInfo, ReclaimState
from jupyterhub_gpupool.pool.reclaimpolicy import PolicySet, ReclaimPolicy
from jupyterhub_gpupool.pool.rules.reclaim import Said
from tests.allocrig import (
    CATALOG,
    NOTICE_COLUMN_DEADLINE,
    decided,
    granted,
    lease,
    noticed,
    pool,
    queued,
    req,
    under_notice,
)
from tests.allocrig import refusal as refused

#: 2026-01-01T00:00:00Z: the budget periods start at midnight.
MIDNIGHT = 1767225600.0


def outcome(alloc, command: c.Command, now: float = 1000.0, **facts):
    """``decide`` on ``alloc`` at the round's time, checking that it changed nothing."""
    return decided(alloc, command, now, **facts)


def refusal(alloc, command, now: float = 1000.0, **facts) -> Refusal:
    return refused(alloc, command, now, **facts)


def _round(alloc, watched, now: float = 1000.0, **facts):
    command = c.ReclaimRound("r1", (now - 30.0, now), {})
    return outcome(alloc, command, now, watched=tuple(watched), policies=PolicySet(), **facts)


def _info(lid: str, offer: str, rs: ReclaimState, units: int = 1) -> LeaseInfo:
    return LeaseInfo(lid, "u", offer, Fraction(units), 0.0, state=rs)


# -- a round ---------------------------------------------------------------------------------


def test_a_round_acts_on_an_admin_notice_at_its_deadline_and_counts_before():
    alloc = pool()
    due = _info("A", "h100", under_notice("admin", 900.0))
    later = _info("B", "h100", under_notice("budget", 5000.0))
    out = _round(alloc, [due, later])
    claim, counted = out.effects
    assert isinstance(claim, ReclaimClaimed) and claim.lease_id == "A"
    assert (claim.release, claim.target, claim.data["action"]) == ("admin", None, "stop")
    assert counted == ReclaimCounted("B", later.state)
    assert [(s.lease, s.kind) for s in out.answer] == [("A", "act"), ("B", "noticed")]
    assert out.answer[0].extra["deadline"] == datetime(1970, 1, 1, 0, 15, tzinfo=timezone.utc)


def test_a_claimed_action_is_waited_for_then_handed_out_again():
    alloc = pool()
    then = datetime(2026, 1, 1, 0, 15, tzinfo=timezone.utc)
    fresh = noticed("A", acting=900.0, since=then, reclaim_release="admin")
    stale = noticed("B", acting=100.0, since=then - timedelta(minutes=30), reclaim_release="admin")
    out = _round(alloc, [], claimed=(fresh, stale), claim_timeout=600.0)
    (again,) = out.effects
    assert again == ReclaimClaimed(
        "B", "admin", None, {"action": "stop", "again": True, "claimed": stale.since}
    )
    reason = "being reclaimed (stop) since 2026-01-01T00:15:00Z"  # the words: the time as text
    assert out.answer[0] == Said("A", "none", reason, {})
    assert out.answer[1].kind == "act" and out.answer[1].extra["release_reason"] == "admin"
    assert out.answer[1].extra["deadline"] == NOTICE_COLUMN_DEADLINE  # the column, as read


def _three_of_four_3g(alloc) -> None:
    for i in range(3):
        granted(alloc.submit(req(f"m{i}", "a100-3g", "v", server=f"m{i}"), 0))


def test_a_rounds_shrinks_reserve_their_targets_one_after_the_other():
    """Make-before-break: the first shrink takes the last 3g slice, so the second, which the
    same round decides on the pool as the first leaves it, is deferred (its target queued and
    cancelled at once)."""
    alloc = pool()
    _three_of_four_3g(alloc)
    for lid in ("A", "B"):
        granted(alloc.submit(req(lid, "h100", server=lid), 0))
    rs = under_notice("admin", 900.0, "shrink:a100-3g")
    out = _round(
        alloc,
        [_info("A", "h100", rs), _info("B", "h100", rs)],
        leases={"A": lease("A", "reclaiming", offer="h100"), "B": lease("B", "reclaiming")},
        shrinks={"A": Shrinkable("TA"), "B": Shrinkable("TB")},
    )
    grant, claim, wait, cancel = out.effects[:4]
    assert isinstance(grant, LeaseGranted) and grant.new == NewLease(None, "A")
    assert grant.grant.request.id == "TA" and grant.grant.offer == "a100-3g"
    assert isinstance(claim, ReclaimClaimed) and (claim.lease_id, claim.target) == ("A", "TA")
    assert isinstance(wait, LeaseQueued) and wait.queued.request.id == "TB"
    assert cancel == LeaseReleased("TB", "cancelled", "queued")
    assert [s.kind for s in out.answer] == ["act", "deferred"]
    assert out.answer[0].extra["target_lease"] == "TA"
    assert "has no room now" in out.answer[1].reason


def test_a_shrink_the_pool_refuses_is_deferred_with_the_refusal():
    alloc = pool()
    granted(alloc.submit(req("A", "h100", server="A"), 0))
    out = _round(
        alloc,
        [_info("A", "h100", under_notice("admin", 900.0, "shrink:a100-3g"))],
        leases={"A": lease("A", "reclaiming", offer="h100", clusters=("gone",))},
        shrinks={"A": Shrinkable("TA")},
        clusters=("east",),
    )
    assert out.effects == ()
    (said,) = out.answer
    assert said.kind == "deferred" and "unknown cluster 'gone'" in said.reason


# -- the outcome of an action ----------------------------------------------------------------


def _acting(state: str = "reclaiming", **kw):
    return noticed("L", state, acting=900.0, reclaim_release="reclaimed-idle", **kw)


def test_a_done_reclaim_releases_the_lease_with_its_reason_and_serves_the_queue():
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req("L" if i == 0 else f"h{i}", "h100", server=f"s{i}"), 0))
    queued(alloc.submit(req("w", "h100", "v", server="sv"), 1.0))
    n = _acting(reclaiming=True)
    command = c.ReclaimOutcome("L", "r1", "done", ("a.ipynb",), "saved")
    out = outcome(alloc, command, leases={"L": n.lease}, noticed=(n,))
    released, grant, ended = out.effects
    assert released == LeaseReleased("L", "reclaimed-idle", "reclaiming")
    assert isinstance(grant, LeaseGranted) and grant.grant.request.id == "w"
    assert isinstance(ended, ReclaimEnded) and ended.kind == "reclaimed"
    assert (ended.unclaimed, ended.forgotten, ended.state) == (True, False, None)
    assert ended.data["saved"] == ["a.ipynb"] and ended.data["outcome"] == "done"


def test_a_failed_reclaim_gives_the_gpu_back_and_cancels_the_shrink_target():
    alloc = pool()
    granted(alloc.submit(req("L", "h100", server="L"), 0))
    granted(alloc.submit(req("T", "a100-3g", server="L"), 0))
    n = _acting(reclaim_target="T")
    leases = {"L": n.lease, "T": lease("T", "granted", server="L", resize_of="L")}
    out = outcome(alloc, c.ReclaimOutcome("L", "r1", "failed"), leases=leases, noticed=(n,))
    cancelled, ended = out.effects
    assert cancelled == LeaseReleased("T", "cancelled", "granted")
    assert ended == ReclaimEnded(
        "L", "reclaim-failed", ended.data, forgotten=True, state=ReclaimState(last_busy=1000.0)
    )
    assert ended.data["target_lease"] == "T" and ended.data["outcome"] == "failed"


def test_an_outcome_needs_a_claimed_action_and_a_known_result():
    alloc, n = pool(), noticed("L")
    e = refusal(alloc, c.ReclaimOutcome("L", "r1", "done"), leases={"L": n.lease}, noticed=(n,))
    assert e.code == "not_acting"
    e = refusal(alloc, c.ReclaimOutcome("L", "r1", "maybe"), noticed=(n,))
    assert (e.code, e.field, e.allowed) == ("invalid_field", "result", ["done", "failed"])


def test_an_enforced_notice_the_service_stopped_is_released_and_one_not_stopped_stays():
    alloc = pool()
    granted(alloc.submit(req("L", "h100", server="L"), 0))
    n = noticed("L", acting=900.0, reclaim_release="budget")
    stopped = outcome(alloc, c.NoticeEnforced("L", True), leases={"L": n.lease}, noticed=(n,))
    assert stopped.effects[0] == LeaseReleased("L", "budget", "reclaiming")
    assert stopped.effects[-1].kind == "reclaimed" and stopped.effects[-1].data["enforced"]
    kept = outcome(alloc, c.NoticeEnforced("L", False, "hub said no"), noticed=(n,))
    (ended,) = kept.effects
    assert (ended.kind, ended.unclaimed, ended.data["detail"]) == (
        "reclaim-failed",
        False,
        "hub said no",
    )


# -- the administrator's policy --------------------------------------------------------------


def test_a_policy_is_checked_against_the_offers_before_it_is_set():
    alloc = pool()
    section = {"offers": {"h100": {"idle_timeout": "1h"}}}
    out = outcome(alloc, c.PutReclaimPolicy(section), catalog=CATALOG)
    assert out.effects == (ReclaimPolicySet(section),)
    e = refusal(alloc, c.PutReclaimPolicy({"offers": {"nope": {}}}), catalog=CATALOG)
    assert (e.code, e.field) == ("invalid_field", "reclaim.offers") and "nope" in e.message
    assert e.message.count(" (allowed:") == 1 and "h100" in list(e.allowed or ())
    e = refusal(alloc, c.PutReclaimPolicy({"default": {"max_age": "400d"}}))
    assert (e.field, e.message) == (
        "reclaim.default.max_age",
        "reclaim.default.max_age: must be at most 366 days",
    )


def test_a_reset_drops_an_override_and_changes_nothing_without_one():
    alloc = pool()
    assert outcome(alloc, c.ResetReclaimPolicy(), policy_override=True).effects == (
        ReclaimPolicyReset(),
    )
    assert outcome(alloc, c.ResetReclaimPolicy()).effects == ()


# -- an administrator's reclaim, extension and cancel ----------------------------------------


def _one(n, **kw) -> dict:
    return {"leases": {n.lease.id: n.lease}, "noticed": (n,), **kw}


def test_an_admin_reclaim_gives_a_notice_ending_after_the_offers_warning():
    n = noticed("L", "active")
    policy = ReclaimPolicy(warn_before=300.0)
    out = outcome(pool(), c.AdminReclaim("L"), **_one(n, policy=policy, actor="admin:ann"))
    (given,) = out.effects
    assert isinstance(given, NoticeGiven) and given.lease_id == "L"
    rec = given.state.reclaiming
    assert (rec.kind, rec.deadline, rec.action) == ("admin", 1300.0, "stop")
    assert rec.reason == "an administrator (admin:ann) reclaims this GPU"


def test_an_admin_reclaim_releases_at_once_when_asked_or_when_nothing_is_bound():
    alloc = pool()
    granted(alloc.submit(req("L", "h100", server="L"), 0))
    now = outcome(alloc, c.AdminReclaim("L", immediately=True), **_one(noticed("L", "active")))
    assert now.effects == (LeaseReleased("L", "admin", "active"),)
    grant = outcome(alloc, c.AdminReclaim("L", grace=60.0), **_one(noticed("L", "granted")))
    assert grant.effects == (LeaseReleased("L", "admin", "granted"),)


@pytest.mark.parametrize(
    ("n", "command", "code"),
    [
        (noticed("L", "queued"), c.AdminReclaim("L"), "not_live"),
        (noticed("L", acting=1.0), c.AdminReclaim("L", grace=1.0), "reclaim_in_progress"),
        (noticed("L"), c.AdminReclaim("L", action="explode"), "invalid_field"),
        (noticed("L"), c.AdminReclaim("L", grace=-1.0), "invalid_field"),
        (noticed("L", "active"), c.ExtendNotice("L", 60.0), "no_notice"),
        (noticed("L", acting=1.0), c.ExtendNotice("L", 60.0), "reclaim_in_progress"),
        (noticed("L"), c.ExtendNotice("L", 0.0), "invalid_field"),
        (noticed("L", "active"), c.CancelNotice("L"), "no_notice"),
        (noticed("L", acting=1.0), c.CancelNotice("L"), "reclaim_in_progress"),
    ],
)
def test_what_an_admin_cannot_do_to_a_notice_is_refused(n, command, code):
    e = refusal(pool(), command, **_one(n, policy=ReclaimPolicy()))
    assert e.code == code


def test_an_extension_counts_from_the_deadline_or_from_now_once_it_passed():
    later = outcome(pool(), c.ExtendNotice("L", 60.0), 400.0, **_one(noticed("L")))
    (moved,) = later.effects
    assert isinstance(moved, NoticeMoved) and moved.seconds == 60.0
    assert moved.state.reclaiming.deadline == 560.0  # the deadline was 500
    past = outcome(pool(), c.ExtendNotice("L", 60.0), 700.0, **_one(noticed("L")))
    assert past.effects[0].state.reclaiming.deadline == 760.0


def test_a_cancel_withdraws_the_notice_with_the_admins_name():
    n = noticed("L", rs=under_notice("idle", idle_since=0.0))
    out = outcome(pool(), c.CancelNotice("L"), **_one(n, policy=ReclaimPolicy(), actor="admin:ann"))
    (gone,) = out.effects
    assert isinstance(gone, NoticeWithdrawn) and (gone.kind, gone.notice) == ("idle", "why")
    assert gone.why == "an administrator (ann) withdrew the notice"
    assert gone.state.reclaiming is None
    said = outcome(pool(), c.CancelNotice("L", " fixed "), **_one(n, policy=ReclaimPolicy()))
    assert said.effects[0].why == "fixed"


# -- overdue notices -------------------------------------------------------------------------


def test_overdue_notices_no_one_carries_out_are_claimed_with_their_kinds_release():
    overdue = (
        noticed("a", rs=under_notice("exception")),
        noticed("b", rs=under_notice("budget"), acting=100.0),  # a claimer that died
        noticed("c", rs=under_notice("drain"), acting=900.0),  # being carried out
    )
    out = outcome(pool(), c.EnforceNotices(60.0), noticed=overdue, claim_timeout=600.0)
    a, b = out.effects
    assert (a.lease_id, a.release, a.data["again"]) == ("a", "lapsed", False)
    assert (b.lease_id, b.release, b.data["again"]) == ("b", "budget", True)
    assert "within 60 s of its deadline" in a.data["enforced"]
    assert [o["lease"] for o in out.answer] == ["a", "b"]
    assert out.answer[0]["deadline"] == NOTICE_COLUMN_DEADLINE
    assert a.data["deadline"] == NOTICE_COLUMN_DEADLINE  # the store writes the event's text
    assert refusal(pool(), c.EnforceNotices(-1.0)).field == "overdue"


# -- budgets ---------------------------------------------------------------------------------


def _spent(alloc, action: str = "stop", used: float = 10.0):
    """``alloc`` with user ``u``'s day budget of 10 unit-hours ``used`` so far."""
    spec = QuotaSpec(budget=Fraction(10), period="day", budget_action=action)
    alloc.quotas.users["u"], alloc.quotas.used_hours["u"] = spec, used
    return alloc


def test_a_spent_stop_budget_warns_once_and_gives_its_leases_a_notice():
    alloc = pool()
    for lid in ("A", "G"):
        granted(alloc.submit(req(lid, "h100", server=lid), 0))
    _spent(alloc)
    bound = noticed("A", "active")
    done = noticed("D", rs=under_notice("budget"))  # already under the budget's notice
    grant = noticed("G", "granted")
    now = MIDNIGHT + 3600.0
    out = outcome(
        alloc,
        c.BudgetRound(300.0),
        now,
        leases={"A": bound.lease, "G": grant.lease, "D": done.lease},
        noticed=(bound, done, grant),
    )
    warned, given, released = out.effects[:3]
    assert isinstance(warned, BudgetWarned) and warned.warning["level"] == 100
    assert warned.warning["period_start"] == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert isinstance(given, NoticeGiven) and given.lease_id == "A"
    assert (given.state.reclaiming.kind, given.state.reclaiming.deadline) == ("budget", now + 300)
    assert released == LeaseReleased("G", "budget", "granted")  # after the notices
    assert out.answer == [warned.warning]
    again = outcome(alloc, c.BudgetRound(), now, warned=(("user", "u", 100, MIDNIGHT + 1.0),))
    assert again.effects == () and again.answer == []


def test_a_budget_warns_at_80_percent_and_a_notify_budget_stops_nothing():
    alloc = _spent(pool(), "notify", used=8.5)
    out = outcome(alloc, c.BudgetRound(), MIDNIGHT, noticed=(noticed("A", "active"),))
    (warned,) = out.effects
    assert warned.warning["level"] == 80 and warned.warning["action"] == "notify"
    yesterday = (("user", "u", 80, MIDNIGHT - 1.0),)  # another period: said again
    assert len(outcome(alloc, c.BudgetRound(), MIDNIGHT, warned=yesterday).effects) == 1
