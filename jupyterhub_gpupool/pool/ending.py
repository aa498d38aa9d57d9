"""Ending leases and serving the queue: the one rule every command that ends a lease follows
(``finish``: the queue served with what it frees, borrowed flags re-derived, pending resize
targets ended), and the enforced notice every caller that gives one gives (``admin_notice``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from .allocator import Allocator
from .effects import (
    BorrowedChanged,
    Effect,
    LeaseGranted,
    LeaseReleased,
    NoticeGiven,
    NoticeWithdrawn,
    WaitReason,
)
from .facts import RESTARTING, LeaseFacts, Outcome, PoolState
from .reclaim import Reclaiming, ReclaimState, enforced_release, withdraw, withdrawn_on_uncordon
from .trial import Trial, alone

#: Release reasons of a stop that a reclaim in progress caused (its own reason is kept).
_RECLAIM_STOPS = ("stopped", "resized", "orphaned")


def finish(state: PoolState, lease_id: str, reason: str, now: float) -> Outcome:
    """End the lease ``state.leases[lease_id]`` for ``reason``, with what follows: the queue
    served with what it frees, the owner's borrowed flags re-derived, its pending resize
    targets ended (unless the server restarts into one). For every caller that ends a lease."""
    return Outcome(lease_id, finishing(state, [(state.leases[lease_id], reason)], now))


def serve_queue(alloc: Allocator, now: float) -> Outcome:
    """Grant what the queue can have now."""
    with Trial(alloc) as trial:
        grants = trial.promote(now)
        effects: list[Effect] = [LeaseGranted(g) for g in grants]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(len(grants), tuple(effects))


def ended_reason(facts: LeaseFacts, reason: str) -> str:
    """The reason a lease ends with: a stop that a reclaim in progress caused (the reclaim's
    own stop, or its shrink's bind) is recorded as the reclaim's, whoever releases it first."""
    if facts.reclaiming and reason in _RECLAIM_STOPS:
        return facts.reclaim_release or "reclaimed-idle"
    return reason


def finishing(
    state: PoolState,
    ending: list[tuple[LeaseFacts, str]],
    now: float,
    granted_ends: str | None = None,
) -> tuple[Effect, ...]:
    """End ``ending`` in order, in one trial. ``granted_ends``: the reason a queued request
    listed there ends with if the queue pass of an earlier one granted it meanwhile (it ends
    as the grant it now is, not ``cancelled``)."""
    if len(ending) == 1 and not ending[0][0].targets and alone(state.alloc, ending[0][0].id):
        facts, reason = ending[0]  # nothing follows its end: no trial to play it in
        return (LeaseReleased(facts.id, ended_reason(facts, reason), facts.state),)
    effects: list[Effect] = []
    with Trial(state.alloc) as trial:
        for facts, reason in ending:
            if facts.id in trial.ended:
                continue
            if granted_ends is not None and facts.id in trial.granted:
                facts, reason = replace(facts, state="granted", reason=None), granted_ends
            _finish_one(trial, facts, reason, now, effects)
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return tuple(effects)


def _finish_one(
    trial: Trial, facts: LeaseFacts, reason: str, now: float, effects: list[Effect]
) -> None:
    was = facts.state
    # a lease that ends by its target's bind keeps the target (and an ended one has none)
    cascade = reason != "resized" and was != "released"
    reason = ended_reason(facts, reason)
    effects.append(LeaseReleased(facts.id, reason, was))
    if facts.id in trial.alloc.leases or facts.id in trial.alloc.waiters:
        grants, flags = trial.release(facts.id, now)
    else:  # awaiting approval: held nothing, but the queue may move all the same
        trial.ended.add(facts.id)
        grants, flags = trial.promote(now), []
    effects += [LeaseGranted(g) for g in grants]
    effects += [BorrowedChanged(lid, borrowed) for lid, borrowed in flags]
    if not cascade:
        return
    for target in facts.targets:  # a lease that ends takes its pending resize target along
        if target.id in trial.ended:
            continue
        if target.id in trial.granted:  # the queue pass just granted it: a fresh grant now
            target = replace(target, state="granted", reason=None)
        if target.state == "granted" and (
            target.reason == RESTARTING or target.id == facts.reclaim_target
        ):
            continue  # the server stops to restart into it: it binds it next
        why = {"queued": "cancelled", "awaiting_approval": "withdrawn"}.get(target.state, reason)
        _finish_one(trial, target, why, now, effects)


def admin_notice(
    state: PoolState, facts: LeaseFacts, rs: ReclaimState, notice: Reclaiming, now: float
) -> Outcome:
    """Give ``facts``' live lease the enforced ``notice`` (an administrator's, a drain's, a
    spent budget's, an approval's lapse; ``rs``: its reclaim state now). A grant not yet bound
    is released at once instead (``enforced_release``: nothing runs on it to warn), the queue
    served. A drain's deadline is never pushed back. Answers ``noticed`` or ``released``."""
    if facts.state == "granted":
        ended = finishing(state, [(facts, enforced_release(notice.kind))], now)
        return Outcome("released", ended)
    return Outcome("noticed", (notice_given(facts, rs, notice),))


def notice_given(facts: LeaseFacts, rs: ReclaimState, notice: Reclaiming) -> NoticeGiven:
    """The enforced ``notice`` on a bound lease (a drain's deadline is never pushed back)."""
    rec = rs.reclaiming
    if rec is not None and notice.deadline > rec.deadline and facts.reclaim_kind == "drain":
        notice = replace(notice, deadline=rec.deadline)
    return NoticeGiven(facts.id, replace(rs, reclaiming=notice))


def notices_in(
    trial: Trial,
    given: Iterable[tuple[LeaseFacts, ReclaimState]],
    notice: Reclaiming,
    now: float,
    effects: list[Effect],
) -> tuple[int, int]:
    """``admin_notice`` for many leases in one decision, in ``trial`` (so a grant released
    sees what the earlier ones freed): a lease already leaving (a reclaim acts on it) or
    ended by an earlier one is left alone. Appends the effects; (noticed, released)."""
    noticed = released = 0
    for facts, rs in given:
        if facts.reclaiming or facts.id in trial.ended:
            continue
        if facts.state == "granted":
            _finish_one(trial, facts, enforced_release(notice.kind), now, effects)
            released += 1
        else:
            effects.append(notice_given(facts, rs, notice))
            noticed += 1
    return noticed, released


def uncordon_withdrawals(
    node: str, leases: Iterable[tuple[LeaseFacts, ReclaimState, float]], now: float
) -> list[NoticeWithdrawn]:
    """The notices an uncordon of ``node`` withdraws: each drain notice of its leases
    ((facts, reclaim state, the policy's ``extension``)) that no one is carrying out yet."""
    out = []
    for facts, rs, hold in leases:
        rec = rs.reclaiming
        claimed = facts.claimed_at is not None
        if claimed or rec is None or not withdrawn_on_uncordon(facts.reclaim_kind):
            continue
        why = f"the node {node} is back in service: the drain is called off"
        out.append(NoticeWithdrawn(facts.id, withdraw(rs, now, hold), why, rec.kind, rec.reason))
    return out


def finish_in(
    trial: Trial,
    ending: Iterable[tuple[LeaseFacts, str]],
    now: float,
    effects: list[Effect],
) -> None:
    """``finishing`` in a trial a rule holds already (what it changed before counts), for a
    rule that ends leases as it goes and reads the pool after each (``PreemptJobs``, a MIG
    result's give-ups): each lease of ``ending`` not ended meanwhile ends for its reason.
    Appends the effects; the waiters' reasons are the caller's to add, from its trial."""
    for facts, reason in ending:
        if facts.id not in trial.ended:
            _finish_one(trial, facts, reason, now, effects)
