"""Keepalive, Resize, Reconcile, Approve, Deny, LapseApprovals, SetNode and SetSharing decided by
``pool.decide``, the enforced notice every caller gives (``admin_notice``), and the rules that
differ by a lease's holder (``pool.holders``): each checked on its effects or refusal, with the
allocator left as it was (the rows the applier writes are the store tests' part)."""

from __future__ import annotations

from datetime import datetime, timezone
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.decide import decide
from jupyterhub_gpupool.pool.effects import (
    KeptAlive,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
    NodeFlagsSet,
    NoticeExtended,
    NoticeGiven,
    NoticeWithdrawn,
    RequestApproved,
    RequestDenied,
    RestartMarked,
    SharingSet,
    apply_effect,
)
from jupyterhub_gpupool.pool.ending import admin_notice, uncordon_withdrawals
from jupyterhub_gpupool.pool.facts import Lapsing, LeaseFacts, PoolState
from jupyterhub_gpupool.pool.holders import (
    Held,
    job_after_lease,
    job_granted,
    job_of,
    orphans,
    runner_silent,
)
from jupyterhub_gpupool.pool.reclaim import LeaseInfo, Reclaiming, ReclaimState
from jupyterhub_gpupool.pool.reclaimpolicy import ReclaimPolicy
from tests.allocrig import decided as outcome_of
from tests.allocrig import granted, lease, pool, queued, refusal, req, state_of


def decided(alloc, command: c.Command, now: float = 10.0, **facts) -> tuple:
    """``decide``'s effects on ``alloc`` (checked to change nothing)."""
    return outcome_of(alloc, command, now, **facts).effects


facts = lease
#: When a reclaim's action was claimed (``LeaseFacts.claimed_at``).
AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def full_h100s(alloc, user: str = "u") -> None:
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", user, server=f"s{i}"), 0))


# -- keepalive -------------------------------------------------------------------------------


def test_keepalive_binds_a_ready_grant():
    effects = decided(pool(), c.Keepalive("L"), leases={"L": facts("L", "granted")})
    assert effects == (KeptAlive("L"), LeaseActivated("L"))


def test_keepalive_of_a_bound_lease_notes_liveness_only():
    assert decided(pool(), c.Keepalive("L"), leases={"L": facts("L")}) == (KeptAlive("L"),)


@pytest.mark.parametrize("state", ["queued", "awaiting_approval", "released"])
def test_keepalive_refuses_what_holds_nothing(state):
    e = refusal(pool(), c.Keepalive("L"), leases={"L": facts("L", state)})
    assert (e.code, e.field) == ("not_live", "id")


def test_keepalive_refuses_a_grant_whose_mig_instance_is_not_made():
    e = refusal(pool(), c.Keepalive("L"), leases={"L": facts("L", "granted", ready=False)})
    assert e.code == "not_ready"


def test_keepalive_refuses_a_jobs_lease_before_anything_else():
    job = facts("L", "queued", server="job:j1", holder="job")
    e = refusal(pool(), c.Keepalive("L"), leases={"L": job})
    assert e.code == "job_lease" and "job:j1" in e.message


def test_binding_a_resize_target_ends_the_lease_it_replaces_and_serves_the_queue():
    """Make-before-break: the target's bind releases the old lease (``resized``), whose
    capacity the queue gets at once."""
    alloc = pool()
    full_h100s(alloc)
    queued(alloc.submit(req("w", "h100", "v", server="sv"), 1.0))
    target = facts("t", "granted", server="s0", resize_of="h0")
    old = facts("h0", server="s0", targets=(target,))
    effects = decided(alloc, c.Keepalive("t"), leases={"t": target, "h0": old})
    assert effects[:3] == (
        KeptAlive("t"),
        LeaseActivated("t"),
        LeaseReleased("h0", "resized", "active"),
    )
    assert isinstance(effects[3], LeaseGranted) and effects[3].grant.request.id == "w"
    assert len(effects) == 4  # the target itself is not ended: it is what is being bound


def _noticed(kind: str = "idle", extensions: int = 0, **kw) -> LeaseFacts:
    rec = Reclaiming(kind, 500.0, "idle for 1 h", "stop", 100.0)
    rs = ReclaimState(idle_since=0.0, extensions=extensions, reclaiming=rec)
    info = LeaseInfo("L", "u", "h100", Fraction(1), 0.0, state=rs)
    return facts("L", "reclaiming", reclaim_kind=kind, reclaim=info, **kw)


def test_keepalive_under_an_idle_notice_extends_it():
    policy = ReclaimPolicy(max_extensions=2, extension=600.0)
    (effect,) = decided(pool(), c.Keepalive("L"), 200.0, leases={"L": _noticed()}, policy=policy)
    assert isinstance(effect, NoticeExtended)
    assert (effect.extensions, effect.limit, effect.until) == (1, 2, 800.0)
    assert effect.state.reclaiming is None and effect.state.snooze_until == 800.0


def test_keepalive_past_the_extension_limit_is_refused_with_the_limit():
    policy = ReclaimPolicy(max_extensions=2)
    e = refusal(pool(), c.Keepalive("L"), leases={"L": _noticed(extensions=2)}, policy=policy)
    assert e.code == "extension_limit" and list(e.allowed or ()) == [2]


def test_keepalive_cannot_keep_a_borrowed_notice():
    e = refusal(
        pool(), c.Keepalive("L"), leases={"L": _noticed("borrowed")}, policy=ReclaimPolicy()
    )
    assert e.code == "not_extendable"


def test_keepalive_is_too_late_once_a_reclaim_is_claimed():
    lease = _noticed(claimed_action="stop", claimed_at=AT)
    e = refusal(pool(), c.Keepalive("L"), leases={"L": lease}, policy=ReclaimPolicy())
    assert e.code == "reclaim_in_progress"
    assert "(stop, claimed 2026-01-01T00:00:00Z): too late" in e.message  # the time as text


# -- resize ----------------------------------------------------------------------------------


def test_resize_asks_for_a_target_that_replaces_the_lease():
    alloc = pool()
    lease = facts("L", server="s", offer="a100", group="g", groups=("g",), hub="hub-b")
    (effect,) = decided(alloc, c.Resize("L", "h100"), leases={"L": lease}, new_id="T")
    assert isinstance(effect, LeaseGranted) and effect.new == NewLease("hub-b", "L")
    assert effect.grant.request.id == "T" and effect.grant.request.server == "s"


def test_resize_target_queues_when_nothing_is_free():
    alloc = pool()
    full_h100s(alloc)
    lease = facts("h0", server="s0", offer="a100")
    (effect,) = decided(alloc, c.Resize("h0", "h100"), leases={"h0": lease}, new_id="T")
    assert isinstance(effect, LeaseQueued) and effect.new == NewLease(None, "h0")


@pytest.mark.parametrize(
    ("lease", "more", "code"),
    [
        (facts("L", "queued", offer="a100"), {}, "not_live"),
        (facts("L", offer="h100"), {}, "same_offer"),
        (facts("L", offer="a100"), {"resize_pending": "T0"}, "resize_pending"),
        (facts("L", holder="job", server="job:j", offer="a100"), {}, "job_lease"),
    ],
)
def test_resize_refusals(lease, more, code):
    assert refusal(pool(), c.Resize("L", "h100"), leases={"L": lease}, **more).code == code


def test_a_pending_target_cannot_itself_be_resized():
    leases = {"T": facts("T", "granted", offer="a100", resize_of="L"), "L": facts("L")}
    assert refusal(pool(), c.Resize("T", "h100"), leases=leases).code == "resize_target"
    leases["L"] = facts("L", "released")  # once the lease it replaced ended, it may be
    assert decided(pool(), c.Resize("T", "h100"), leases=leases, new_id="X")


# -- reconcile -------------------------------------------------------------------------------


def test_reconcile_ends_what_no_holder_keeps_and_serves_the_queue():
    """A server the hub no longer runs loses its lease, a queued one is cancelled; a live
    job's lease and every kernel's stay (the hub has no server of theirs)."""
    alloc = pool()
    full_h100s(alloc)
    queued(alloc.submit(req("w", "h100", "v", server="sv"), 1.0))
    held = (
        Held("h0", "u", "s0", "active"),
        Held("h1", "u", "job:j1", "active", "job"),
        Held("h2", "u", "kernel:k", "active", "kernel"),
        Held("h3", "u", "job:j2", "active", "job"),
        Held("w", "v", "sv", "queued"),
    )
    leases = {h.id: facts(h.id, h.state, user=h.user, server=h.server) for h in held}
    jobs_alive = frozenset({("u", "job:j1")})
    effects = decided(
        alloc, c.Reconcile({("x", "y")}), leases=leases, held=held, jobs_alive=jobs_alive
    )
    ended = [(e.lease_id, e.reason, e.was) for e in effects if isinstance(e, LeaseReleased)]
    # the queue got h0's GPU before the waiter itself was reached: it ends as the grant it is
    assert ended == [
        ("h0", "stopped", "active"),
        ("h3", "stopped", "active"),
        ("w", "stopped", "granted"),
    ]
    assert any(isinstance(e, LeaseGranted) and e.grant.request.id == "w" for e in effects)
    state = PoolState(alloc, leases, held=held, jobs_alive=jobs_alive)
    assert decide(state, c.Reconcile(set()), 10.0).answer == 3  # h0, h3, w


def test_reconcile_withdraws_only_requests_of_deleted_servers():
    held = (
        Held("a", "u", "gone", "awaiting_approval"),
        Held("b", "u", "stopped", "awaiting_approval"),
    )
    assert orphans(held, set(), {("u", "gone")}, frozenset(), "stopped") == [("a", "withdrawn")]


def test_reconcile_of_nothing_changes_nothing():
    alloc = pool()
    granted(alloc.submit(req("L", "h100", "u", server="s"), 0))
    before = state_of(alloc)
    held = (Held("L", "u", "s", "active"),)
    outcome = decide(PoolState(alloc, held=held), c.Reconcile({("u", "s")}), 10.0)
    assert (outcome.answer, outcome.effects) == (0, ())
    assert state_of(alloc) == before


def test_reconcile_effects_applied_leave_the_allocator_as_its_own_release_would():
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        full_h100s(a)
        queued(a.submit(req("w", "h100", "v", server="sv"), 1.0))
    held = (Held("h1", "u", "s1", "active"),)
    state = PoolState(alloc, {"h1": facts("h1", server="s1")}, held=held)
    for effect in decide(state, c.Reconcile(set()), 10.0).effects:
        apply_effect(alloc, effect, 10.0)
    twin.release("h1", 10.0)
    assert state_of(alloc) == state_of(twin)


# -- the holders' rules ----------------------------------------------------------------------


def test_a_job_follows_its_lease():
    assert job_of("job", "job:abc") == "abc" and job_of(None, "job:abc") is None
    assert job_granted("queued") and not job_granted("running")
    assert job_after_lease("running", "admin") == ("cancelled", "lease ended: admin")
    assert job_after_lease("running", "node_lost") == ("failed", "lease ended: node_lost")
    assert job_after_lease("succeeded", "admin") is None


def test_a_runner_is_silent_past_its_timeout_or_its_notice_deadline():
    assert runner_silent(0.0, None, 121.0, 120.0)
    assert not runner_silent(0.0, None, 120.0, 120.0)
    assert not runner_silent(0.0, 100.0, 200.0, 120.0)  # the notice's deadline counts
    assert runner_silent(0.0, 100.0, 221.0, 120.0)


def test_an_uncordon_withdraws_the_drain_notices_no_one_carries_out():
    rec = Reclaiming("drain", 500.0, "node drained", "stop", 100.0)
    other = Reclaiming("admin", 500.0, "admin", "stop", 100.0)
    leases = [
        (facts("a", "reclaiming", reclaim_kind="drain"), ReclaimState(reclaiming=rec), 60.0),
        (
            facts("b", "reclaiming", reclaim_kind="drain", claimed_action="stop", claimed_at=AT),
            ReclaimState(reclaiming=rec),
            60.0,
        ),  # claimed: someone carries it out
        (facts("c", "reclaiming", reclaim_kind="admin"), ReclaimState(reclaiming=other), 60.0),
    ]
    (effect,) = uncordon_withdrawals("n1", leases, 200.0)
    assert isinstance(effect, NoticeWithdrawn) and effect.lease_id == "a"
    assert (effect.kind, effect.notice) == ("drain", "node drained")
    assert effect.state.reclaiming is None and effect.state.snooze_until == 260.0
    assert "n1" in effect.why


# -- enforced notices, denials and lapses ----------------------------------------------------


def _notice(kind: str = "admin", deadline: float = 900.0) -> Reclaiming:
    return Reclaiming(kind, deadline, "maintenance", "stop", 100.0)


def test_an_enforced_notice_on_a_bound_lease_is_a_notice():
    lease = facts("L")
    outcome = decide_notice(lease, ReclaimState(idle_since=5.0), _notice())
    assert outcome.answer == "noticed"
    (effect,) = outcome.effects
    assert effect == NoticeGiven("L", ReclaimState(idle_since=5.0, reclaiming=_notice()))


def test_an_enforced_notice_releases_a_grant_not_yet_bound():
    alloc = pool()
    granted(alloc.submit(req("L", "h100", "u", server="s"), 0))
    state = PoolState(alloc, {"L": facts("L", "granted", server="s")})
    outcome = admin_notice(
        state, facts("L", "granted", server="s"), ReclaimState(), _notice("budget"), 10.0
    )
    assert outcome.answer == "released"
    assert outcome.effects == (LeaseReleased("L", "budget", "granted"),)


def test_a_drains_deadline_is_never_pushed_back():
    earlier = ReclaimState(reclaiming=_notice("drain", 500.0))
    lease = facts("L", "reclaiming", reclaim_kind="drain")
    (effect,) = decide_notice(lease, earlier, _notice("drain", 900.0)).effects
    assert effect.state.reclaiming.deadline == 500.0


def decide_notice(lease, rs, notice):
    return admin_notice(PoolState(pool(), {lease.id: lease}), lease, rs, notice, 10.0)


def test_deny_ends_the_request_with_the_reason_the_user_reads():
    lease = facts("L", "awaiting_approval")
    effects = decided(pool(), c.Deny("L", "  not this week "), leases={"L": lease})
    assert effects == (
        RequestDenied("L", "not this week"),
        LeaseReleased("L", "denied", "awaiting_approval"),
    )


@pytest.mark.parametrize(
    ("reason", "code"), [("  ", "missing_field"), ("x" * 256, "invalid_field")]
)
def test_deny_needs_a_reason(reason, code):
    lease = facts("L", "awaiting_approval")
    e = refusal(pool(), c.Deny("L", reason), leases={"L": lease})
    assert (e.code, e.field) == (code, "reason")


def test_deny_of_a_decided_request_is_refused_with_what_it_is():
    lease = facts("L", "released", release_reason="withdrawn")
    e = refusal(pool(), c.Deny("L", "no"), leases={"L": lease})
    assert e.code == "not_awaiting_approval" and "released (withdrawn)" in e.message


def test_approved_time_runs_out_a_notice_first_then_the_end():
    """A bound lease within its ``warn_before`` of the end gets an ``exception`` notice (no
    sooner than ``warn_before`` from now); a queued request past its end lapses; a lease not
    yet within its warning, or already under an earlier notice, is left alone."""
    alloc = pool()
    queued_one = facts("q", "queued")
    lapsing = (
        Lapsing(facts("a"), lapses=1000.0, warn_before=300.0),
        Lapsing(facts("b"), lapses=2000.0, warn_before=300.0),
        Lapsing(
            facts("c", "reclaiming", reclaim_kind="idle"),
            lapses=1000.0,
            warn_before=300.0,
            reclaim=ReclaimState(reclaiming=_notice("idle", 800.0)),
            notice_deadline=800.0,
        ),
        Lapsing(facts("d", reclaim_kind="exception"), lapses=1000.0, warn_before=300.0),
        Lapsing(queued_one, lapses=900.0, warn_before=0.0),
    )
    full_h100s(alloc, "v")
    queued(alloc.submit(req("q", "h100", "u", server="q"), 0))
    outcome = decide(
        PoolState(alloc, {"q": queued_one}, lapsing=lapsing), c.LapseApprovals(), 950.0
    )
    assert outcome.answer == (1, 1)
    notice, ended = outcome.effects
    assert isinstance(notice, NoticeGiven) and notice.lease_id == "a"
    rec = notice.state.reclaiming
    assert (rec.kind, rec.deadline, rec.action) == ("exception", 1250.0, "stop")
    assert rec.reason == "the approved time for this GPU ends at 1970-01-01T00:16:40Z"
    assert ended == LeaseReleased("q", "lapsed", "queued")


# -- nodes -----------------------------------------------------------------------------------


def test_an_uncordon_gives_the_queue_the_nodes_room_at_once():
    """The H100 node was cordoned: a request waits; the uncordon's effects grant it there,
    and applied they leave the allocator as its own uncordon and queue pass would."""
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        a.set_node_flags("h", cordoned=True)
        queued(a.submit(req("w", "h100", "v", server="sv"), 1.0))
    effects = decided(alloc, c.SetNode("h", "uncordon"), node_known=True)
    assert effects[0] == NodeFlagsSet("h", "uncordon", False, False)
    assert isinstance(effects[1], LeaseGranted) and effects[1].grant.node == "h"
    for effect in effects:
        apply_effect(alloc, effect, 10.0)
    twin.set_node_flags("h", cordoned=False, draining=False)
    twin.promote(10.0)
    assert state_of(alloc) == state_of(twin)


def test_a_cordon_only_sets_the_flag():
    alloc = pool()
    queued_before = decided(alloc, c.SetNode("h", "cordon"), node_known=True)
    assert queued_before == (NodeFlagsSet("h", "cordon", True, None),)


def test_an_uncordon_answers_the_drain_notices_it_withdraws():
    rec = Reclaiming("drain", 500.0, "node drained", "stop", 100.0)
    drained = (
        (facts("a", "reclaiming", reclaim_kind="drain"), ReclaimState(reclaiming=rec), 60.0),
    )
    state = PoolState(pool(), node_known=True, drained=drained)
    outcome = decide(state, c.SetNode("h", "uncordon"), 200.0)
    assert outcome.answer == ["a"] and isinstance(outcome.effects[-1], NoticeWithdrawn)


@pytest.mark.parametrize(
    ("action", "known", "field"), [("reboot", True, "action"), ("cordon", False, "name")]
)
def test_set_node_refusals(action, known, field):
    e = refusal(pool(), c.SetNode("h", action), node_known=known)
    assert (e.code, e.field) == ("not_found", field)


# -- approvals -------------------------------------------------------------------------------


def _awaiting(offer: str = "h100", **more) -> dict:
    request = req("L", offer, "u", server="s")
    return {
        "leases": {"L": facts("L", "awaiting_approval", offer=offer)},
        "request": request,
        **more,
    }


def test_approve_joins_the_queue_or_is_granted_now():
    effects = decided(pool(), c.Approve("L", note=" ok "), **_awaiting(asked_duration=3600.0))
    approved, joins = effects
    assert approved == RequestApproved("L", 3600.0, "h100", "ok", Fraction(1))
    assert isinstance(joins, LeaseGranted) and joins.new is None and joins.grant.request.id == "L"
    alloc = pool()
    full_h100s(alloc)
    assert isinstance(decided(alloc, c.Approve("L"), **_awaiting())[1], LeaseQueued)


def test_approve_may_shorten_the_duration_not_lengthen_it():
    (approved, _) = decided(
        pool(), c.Approve("L", duration=60.0), **_awaiting(asked_duration=600.0)
    )
    assert approved.duration == 60.0
    e = refusal(pool(), c.Approve("L", duration=6000.0), **_awaiting(asked_duration=600.0))
    assert (e.code, e.field) == ("invalid_field", "duration")


def test_approve_may_lower_the_ask_to_a_smaller_offer_of_its_kind_only():
    e = refusal(pool(), c.Approve("L", offer="h100"), **_awaiting("a100-1g"))
    assert (e.code, e.field) == ("invalid_field", "offer")
    assert refusal(pool(), c.Approve("L", offer="nope"), **_awaiting()).code == "unknown_offer"


def test_approve_of_a_request_the_pool_refuses_now_leaves_it_awaiting():
    e = refusal(pool(), c.Approve("L"), **_awaiting("nope"))
    assert e.code == "unknown_offer" and "(the request still awaits a decision)" in e.message


def test_approve_of_a_decided_request_is_refused():
    leases = {"L": facts("L", "queued")}
    assert refusal(pool(), c.Approve("L"), leases=leases).code == "not_awaiting_approval"


# -- sharing modes ---------------------------------------------------------------------------

H100S = tuple((f"h-H{i}", "exclusive", False) for i in range(4))


def test_a_gpu_advertised_shared_takes_the_waiting_share_at_once():
    """H0 is the one shared GPU and its four shares are held: a fifth waits until H1 is
    advertised shared too."""
    alloc, twin = pool(), pool()
    gpus = (("h-H0", "shared", False), *H100S[1:])
    for a in (alloc, twin):
        for uuid, mode, _ in gpus:
            a.set_gpu_sharing(uuid, mode)
        for i in range(4):
            granted(a.submit(req(f"s{i}", "shared", "u", server=f"s{i}"), 0.0))
        queued(a.submit(req("w", "shared", "v", server="sv"), 1.0))
    cmd = c.SetSharing("h", {"h-H1": "shared", "h-H2": "exclusive", "nope": "shared"})
    outcome = decide(PoolState(alloc, node_known=True, node_gpus=gpus), cmd, 10.0)
    assert outcome.answer == {"h-H1": "shared"}
    assert outcome.effects[0] == SharingSet("h", (("h-H1", "shared"),))
    grant = outcome.effects[1]
    assert isinstance(grant, LeaseGranted) and grant.grant.slots[0].gpu == "h-H1"
    for effect in outcome.effects:
        apply_effect(alloc, effect, 10.0)
    twin.set_gpu_sharing("h-H1", "shared")
    twin.promote(10.0)
    assert state_of(alloc) == state_of(twin)


def test_sharing_unchanged_or_on_a_mig_gpu_changes_nothing():
    gpus = (("h-H0", "exclusive", False), ("mig-A0", "exclusive", True))
    cmd = c.SetSharing("h", {"h-H0": "exclusive", "mig-A0": "shared"})
    outcome = decide(PoolState(pool(), node_known=True, node_gpus=gpus), cmd, 10.0)
    assert (outcome.answer, outcome.effects) == ({}, ())


def test_set_sharing_refusals():
    gpus = (("h-H0", "exclusive", False),)
    e = refusal(pool(), c.SetSharing("h", {"h-H0": "half"}), node_known=True, node_gpus=gpus)
    assert e.code == "invalid_field" and "half" in e.message
    assert refusal(pool(), c.SetSharing("h", {}), node_known=False).code == "not_found"


# -- a restart into a resize target ----------------------------------------------------------


def test_a_restart_marks_only_a_granted_resize_target():
    """The service restarts a server into its granted target: that target is marked, so the
    old lease's end leaves it alone; a lease that is no granted target (bound meanwhile, an
    ordinary grant, released) is left as it is, and nothing else changes."""
    alloc = pool()
    target = facts("t", "granted", resize_of="old")
    assert decided(alloc, c.MarkRestarting("t"), leases={"t": target}) == (RestartMarked("t"),)
    for other in (
        facts("t", "active", resize_of="old"),
        facts("t", "granted"),
        facts("t", "released", resize_of="old"),
    ):
        assert decided(alloc, c.MarkRestarting("t"), leases={"t": other}) == ()
