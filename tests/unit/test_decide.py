"""The pool decides, the store applies: ``pool.decide`` returns effects and changes nothing.

Each rule is checked on its effects (grant, queue, refusal, approval, release serving the queue,
borrowed flags, expiry, resize targets, quota edits), and that applying the effects in order
(``pool.effects.apply_effect``) leaves the allocator exactly as the allocator's own mutating
``release`` / ``promote`` would; the rows they make are the store tests' part.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.decide import DECIDED, REBUILDS, RECORDS, decide
from jupyterhub_gpupool.pool.effects import (
    AwaitingApproval,
    BorrowedChanged,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
    QuotaReset,
    QuotaSet,
    WaitReason,
)
from jupyterhub_gpupool.pool.errors import Refusal
from jupyterhub_gpupool.pool.facts import RESTARTING, Holder, PoolState
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaInEffect, QuotaSpec
from jupyterhub_gpupool.pool.rules.quotas import quota_preview
from tests.allocrig import apply_all, granted, lease, offers, pool, queued, req, state_of
from tests.allocrig import decided as outcome_of


def decided(alloc: Allocator, command: c.Command, now: float = 10.0, **facts) -> tuple:
    """``decide``'s effects on ``alloc`` (checked to change nothing)."""
    return outcome_of(alloc, command, now, **facts).effects


facts = lease

F = Fraction


def full_h100s(alloc: Allocator, user: str = "u") -> None:
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", user, server=f"s{i}"), 0))


# -- allocate --------------------------------------------------------------------------------


def test_allocate_grants_as_an_effect_and_holds_nothing_until_applied():
    alloc = pool()
    cmd = c.Allocate("u", "s", "h100", hub="hub-b")
    (effect,) = decided(alloc, cmd, new_id="L1")
    assert isinstance(effect, LeaseGranted) and effect.new == NewLease("hub-b", None)
    assert effect.grant.request.id == "L1" and effect.grant.node == "h"
    assert alloc.leases == {}
    apply_all(alloc, (effect,))
    assert list(alloc.leases) == ["L1"]


def test_allocate_queues_when_nothing_is_free():
    alloc = pool()
    full_h100s(alloc)
    (effect,) = decided(alloc, c.Allocate("v", "s", "h100"), new_id="W")
    assert isinstance(effect, LeaseQueued)
    assert (effect.queued.position, effect.queued.reason) == (1, "no_capacity")


def test_allocate_refusals_carry_their_code_and_no_effects():
    alloc = pool()
    with pytest.raises(Refusal) as e:
        decide(PoolState(alloc, new_id="x"), c.Allocate("u", "s", "nope"), 0.0)
    assert e.value.code == "unknown_offer" and e.value.field == "offer"
    held = Holder("L0", "granted", None)
    with pytest.raises(Refusal, match="already has lease L0") as e:
        decide(PoolState(alloc, holder=held, new_id="x"), c.Allocate("u", "s", "h100"), 0.0)
    assert e.value.code == "already_allocated"
    other_hub = Holder("L0", "granted", "hub-b")
    with pytest.raises(Refusal, match="through another hub"):
        decide(PoolState(alloc, holder=other_hub, new_id="x"), c.Allocate("u", "s", "h100"), 0.0)
    # a resize target is the server's second request: the holder is the lease it replaces
    resize = c.Allocate("u", "s", "h100", resize_of="L0")
    assert decide(PoolState(alloc, holder=held, new_id="x"), resize, 0.0).effects
    with pytest.raises(Refusal) as e:
        decide(
            PoolState(alloc, awaiting=2, request_cap=2, new_id="x"),
            c.Allocate("u", "s", "h100"),
            0.0,
        )
    assert e.value.code == "too_many_requests"


def test_an_offer_needing_approval_asks_for_it():
    alloc = Allocator(
        pool().nodes.values(),
        offers({"name": "big", "kind": "gpu", "count": 2, "approval": "required"}),
    )
    with pytest.raises(Refusal) as e:
        decide(PoolState(alloc, new_id="A"), c.Allocate("u", "s", "big"), 0.0)
    assert (e.value.code, e.value.field) == ("missing_field", "reason")
    (effect,) = decided(alloc, c.Allocate("u", "s", "big", reason="a deadline"), new_id="A")
    assert isinstance(effect, AwaitingApproval)
    assert effect.ask.required_by == ("offer",) and effect.reason == "a deadline"
    apply_all(alloc, (effect,))
    assert alloc.leases == {} and alloc.waiters == {}  # it holds nothing meanwhile


# -- release, expiry, the queue ---------------------------------------------------------------


def test_a_release_serves_the_queue_with_what_it_frees():
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        full_h100s(a)
        queued(a.submit(req("w", "h100", "v", server="w"), 1.0))
    effects = decided(alloc, c.Release("h2"), leases={"h2": facts("h2", server="s2")})
    assert [type(e) for e in effects] == [LeaseReleased, LeaseGranted]
    assert effects[0] == LeaseReleased("h2", "stopped", "active")
    assert effects[1].grant.request.id == "w" and effects[1].grant.slots[0].gpu == "h-H2"
    apply_all(alloc, effects)
    assert [g.request.id for g in twin.release("h2", 10.0)] == ["w"]
    assert state_of(alloc) == state_of(twin)


def test_leaving_the_queue_or_withdrawing_is_said_so():
    alloc = pool()
    full_h100s(alloc)
    queued(alloc.submit(req("w", "h100", "v", server="w"), 1.0))
    (effect,) = decided(alloc, c.Release("w"), leases={"w": facts("w", "queued", user="v")})
    assert effect == LeaseReleased("w", "cancelled", "queued")
    (effect,) = decided(alloc, c.Release("a"), leases={"a": facts("a", "awaiting_approval")})
    assert effect == LeaseReleased("a", "withdrawn", "awaiting_approval")
    assert decided(alloc, c.Release("r"), leases={"r": facts("r", "released")}) == ()


def test_a_release_brings_the_owners_later_lease_within_guarantee():
    book = QuotaBook(users={"u": QuotaSpec(guarantee=F(1))})
    alloc = pool(book)
    first = granted(alloc.submit(req("one", "h100", "u", server="a", arrival=0.0), 0))
    second = granted(alloc.submit(req("two", "h100", "u", server="b", arrival=1.0), 0))
    assert (first.borrowed, second.borrowed) == (False, True)
    effects = decided(alloc, c.Release("one"), leases={"one": facts("one", server="a")})
    assert effects == (LeaseReleased("one", "stopped", "active"), BorrowedChanged("two", False))
    apply_all(alloc, effects)
    assert not alloc.leases["two"].borrowed


def test_a_release_brings_another_members_lease_within_the_groups_guarantee():
    """Its owner holds nothing else and nobody waits, but its group has a quota: the group's
    other leases are re-derived (no shortcut past the trial, ``pool.trial.alone``)."""
    book = QuotaBook(groups={"g": QuotaSpec(guarantee=F(1))})
    alloc = pool(book)
    first = granted(alloc.submit(req("a", "h100", "u", server="a", groups=("g",)), 0))
    second = granted(alloc.submit(req("b", "h100", "v", server="b", groups=("g",)), 0))
    assert (first.group, first.borrowed, second.borrowed) == ("g", False, True)
    effects = decided(alloc, c.Release("a"), leases={"a": facts("a", server="a")})
    assert effects == (LeaseReleased("a", "stopped", "active"), BorrowedChanged("b", False))
    apply_all(alloc, effects)
    assert not alloc.leases["b"].borrowed


def test_a_release_that_changes_nothing_else_is_its_end_alone():
    """Nobody waits and the owner holds nothing else: the end, and the pool left as it was
    until the end is applied (then as ``Allocator.release`` leaves it)."""
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        granted(a.submit(req("x", "h100", "u", server="x"), 0))
        granted(a.submit(req("y", "h100", "v", server="y"), 0))
    effects = decided(alloc, c.Release("x"), leases={"x": facts("x", server="x")})
    assert effects == (LeaseReleased("x", "stopped", "active"),)
    apply_all(alloc, effects)
    assert twin.release("x", 10.0) == []
    assert state_of(alloc) == state_of(twin)


def test_a_reclaims_stop_is_recorded_as_the_reclaim():
    alloc = pool()
    granted(alloc.submit(req("x", "h100", "u", server="x"), 0))
    ending = facts("x", server="x", reclaiming=True, reclaim_release="reclaimed-borrowed")
    (effect,) = decided(alloc, c.Release("x"), leases={"x": ending})
    assert effect == LeaseReleased("x", "reclaimed-borrowed", "active")


def test_expiry_releases_each_unbound_grant_and_serves_the_queue_once_each():
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        full_h100s(a)
        queued(a.submit(req("w", "h100", "v", server="w"), 1.0))
    unbound = {lid: facts(lid, "granted", server=f"s{lid[1]}") for lid in ("h0", "h1")}
    outcome = decide(PoolState(alloc, unbound), c.ExpireGrants(), 10.0)
    assert outcome.answer == 2
    assert [(type(e).__name__, getattr(e, "reason", None)) for e in outcome.effects] == [
        ("LeaseReleased", "expired"),
        ("LeaseGranted", None),
        ("LeaseReleased", "expired"),
    ]
    apply_all(alloc, outcome.effects)
    twin.release("h0", 10.0)
    twin.release("h1", 10.0)
    assert state_of(alloc) == state_of(twin)


def test_promote_grants_what_a_raised_limit_lets_in_and_notes_why_others_wait():
    book = QuotaBook(users={"u": QuotaSpec(limit=F(1))})
    alloc = pool(book)
    granted(alloc.submit(req("one", "h100", "u", server="a"), 0))
    assert queued(alloc.submit(req("two", "h100", "u", server="b"), 0)).reason == "quota"
    assert decided(alloc, c.Promote()) == ()
    alloc.quotas.users["u"] = QuotaSpec(limit=F(2))
    (effect,) = decided(alloc, c.Promote())
    assert isinstance(effect, LeaseGranted) and effect.grant.request.id == "two"
    assert effect.new is None  # a waiter's grant: its row exists


def test_a_waiters_reason_follows_the_queue_pass():
    book = QuotaBook(users={"v": QuotaSpec(limit=F(1))})
    alloc = pool(book)
    full_h100s(alloc)
    granted(alloc.submit(req("v0", "a100-1g", "v", server="v0"), 0))
    assert queued(alloc.submit(req("v1", "h100", "v", server="v1"), 0)).reason == "quota"
    alloc.quotas.users["v"] = QuotaSpec(limit=F(4))  # within its limit now, still no H100
    assert decided(alloc, c.Promote()) == (WaitReason("v1", "no_capacity"),)


def test_a_lease_that_ends_takes_its_pending_target_along_unless_the_server_restarts_into_it():
    alloc = pool()
    granted(alloc.submit(req("old", "h100", "u", server="s"), 0))
    granted(alloc.submit(req("new", "h100", "u", server="s"), 0))
    target = facts("new", "granted", server="s", resize_of="old")
    ending = {"old": facts("old", server="s", targets=(target,))}
    effects = decided(alloc, c.Release("old"), leases=ending)
    assert [e for e in effects if isinstance(e, LeaseReleased)] == [
        LeaseReleased("old", "stopped", "active"),
        LeaseReleased("new", "stopped", "granted"),
    ]
    restarting = facts("new", "granted", server="s", resize_of="old", reason=RESTARTING)
    ending = {"old": facts("old", server="s", targets=(restarting,))}
    assert decided(alloc, c.Release("old"), leases=ending) == (
        LeaseReleased("old", "stopped", "active"),
    )


def test_a_released_mig_instance_is_planned_over_only_in_the_trial():
    """The trial plays the release and the queue pass on the allocator's own devices and puts
    back each GPU's instances as they were (a dynamic-MIG grant plans a new instance)."""
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        for i in range(2):
            granted(a.submit(req(f"m{i}", "a100-3g", "u", server=f"m{i}"), 0))
            granted(a.submit(req(f"n{i}", "a100-3g", "u", server=f"n{i}"), 0))
        queued(a.submit(req("w", "a100-3g", "v", server="w"), 1.0))
    effects = decided(alloc, c.Release("m0"), leases={"m0": facts("m0", server="m0")})
    assert [type(e) for e in effects] == [LeaseReleased, LeaseGranted]
    apply_all(alloc, effects)
    twin.release("m0", 10.0)
    assert state_of(alloc) == state_of(twin)


# -- quota edits and their preview ------------------------------------------------------------


def test_a_quota_edit_is_its_flags_and_the_quota_and_the_preview_discards_them():
    alloc = pool(QuotaBook(users={"u": QuotaSpec(guarantee=F(3))}))
    for i in range(3):
        granted(alloc.submit(req(f"u{i}", "h100", "u", server=f"s{i}", arrival=float(i)), 0))
    current = QuotaInEffect("u", "user", "api", QuotaSpec(guarantee=F(3)))
    cmd = c.PatchQuota("users", "u", {"guarantee": 1})
    effects = decided(alloc, cmd, quota=current)
    assert effects[:2] == (BorrowedChanged("u1", True), BorrowedChanged("u2", True))
    assert isinstance(effects[2], QuotaSet) and effects[2].spec.guarantee == 1
    spec, become_borrowed, become_within = quota_preview(
        PoolState(alloc, quota=current), "users", "u", {"guarantee": 1}
    )
    assert (spec.guarantee, become_borrowed, become_within) == (1, ["u1", "u2"], [])
    assert not any(le.borrowed for le in alloc.leases.values())  # the preview applied nothing
    apply_all(alloc, effects)
    assert alloc.quotas.users["u"].guarantee == 1
    assert sorted(lid for lid, le in alloc.leases.items() if le.borrowed) == ["u1", "u2"]
    put = decide(PoolState(alloc), c.PutQuota("users", "u", {"guarantee": 3}), 0.0)
    assert put.answer.source == "api" and put.answer.spec.guarantee == 3
    assert [e for e in put.effects if isinstance(e, BorrowedChanged)] == [
        BorrowedChanged("u1", False),
        BorrowedChanged("u2", False),
    ]


def test_a_command_not_decided_here_says_so():
    with pytest.raises(ValueError, match="WriteMinutes"):
        decide(PoolState(pool()), c.WriteMinutes({}), 0.0)


def test_the_architecture_page_lists_the_commands_decide_decides():
    """``docs/source/reference/architecture.md`` says which commands go through ``decide``,
    which are records and which rebuild: moving one fails here until the page says so."""
    page = (
        Path(__file__).resolve().parents[2] / "docs/source/reference/architecture.md"
    ).read_text()
    for lead, kinds in (
        ("Decided by `pool.decide` now:", DECIDED),
        ("Records, which take no decision:", RECORDS),
        ("Rebuilds, not decided yet:", REBUILDS),
    ):
        line = page.split(lead, 1)[1].split(".", 1)[0]
        assert set(re.findall(r"`(\w+)`", line)) == {kind.__name__ for kind in kinds}, lead


def test_every_command_is_decided_a_record_or_a_rebuild_and_only_one():
    """A new command must say which it is (``pool.decide``): a decision, a record or a
    rebuild."""
    kinds = {
        v
        for v in vars(c).values()
        if isinstance(v, type) and issubclass(v, c.Command) and v is not c.Command
    }
    assert kinds == DECIDED | RECORDS | REBUILDS
    assert not (DECIDED & RECORDS or DECIDED & REBUILDS or RECORDS & REBUILDS)


def test_a_pending_target_the_release_itself_granted_goes_along_as_granted():
    """The target was queued for the capacity its own lease frees: the queue pass grants it,
    and the lease's end then takes it along as the grant it now is (``stopped``, not
    ``cancelled``)."""
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        full_h100s(a)
        queued(a.submit(req("new", "h100", "u", server="s0"), 1.0))
    target = facts("new", "queued", server="s0", resize_of="h0")
    ending = {"h0": facts("h0", server="s0", targets=(target,))}
    effects = decided(alloc, c.Release("h0"), leases=ending)
    assert [(type(e).__name__, getattr(e, "lease_id", None)) for e in effects] == [
        ("LeaseReleased", "h0"),
        ("LeaseGranted", None),
        ("LeaseReleased", "new"),
    ]
    assert effects[2] == LeaseReleased("new", "stopped", "granted")
    apply_all(alloc, effects)
    assert [g.request.id for g in twin.release("h0", 10.0)] == ["new"]
    twin.release("new", 10.0)
    assert state_of(alloc) == state_of(twin)


def test_a_quota_reset_goes_back_to_the_files_quota_or_none():
    book = QuotaBook(groups={"ml": QuotaSpec(guarantee=F(2))})
    alloc = pool(book)
    for i, user in enumerate(("a", "b")):
        granted(alloc.submit(req(f"{user}0", "h100", user, group="ml", groups=("ml",)), i))
    reset = c.ResetQuota("groups", "ml")
    assert decided(alloc, reset) == ()  # no API override: nothing to drop
    (effect,) = decided(alloc, reset, quota_override=True, file_quota=QuotaSpec(guarantee=F(2)))
    assert effect == QuotaReset("group", "ml", QuotaSpec(guarantee=F(2)))
    effects = decided(alloc, reset, quota_override=True)  # the file has none for ml
    assert effects == (
        BorrowedChanged("a0", True),
        BorrowedChanged("b0", True),
        QuotaReset("group", "ml", None),
    )
    apply_all(alloc, effects)
    assert "ml" not in alloc.quotas.groups
    assert alloc.rederive_borrowed(group="ml") == []  # the flags are what the rule says
