"""Approvals: an administrator's approval or denial of a request, and approved time lapsing."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ...timeparse import format_epoch
from .. import commands as c
from ..allocator import Allocator
from ..approval import MAX_REASON, AskError, check_ask
from ..decisions import Grant, Rejected
from ..effects import Effect, LeaseGranted, LeaseQueued, RequestApproved, RequestDenied
from ..ending import admin_notice, finishing
from ..errors import Refusal
from ..facts import LeaseFacts, Outcome, PoolState, Rule
from ..reclaim import Reclaiming


def not_awaiting(facts: LeaseFacts) -> Refusal | None:
    """The refusal of an administrator's decision on a lease that awaits none (withdrawn,
    decided, never asked)."""
    if facts.state == "awaiting_approval":
        return None
    was = f"{facts.state} ({facts.release_reason})" if facts.release_reason else facts.state
    return Refusal(
        "not_awaiting_approval",
        f"lease {facts.id} is {was}: there is no request to decide",
        field="id",
    )


def approval_note(note: str, duration: object) -> str:
    """An approval's note (stripped) and duration checked as an ask's reason and duration are
    (the note's refusals name ``note``)."""
    try:
        return check_ask(note, duration)
    except AskError as e:
        field = "note" if e.field == "reason" else e.field
        raise Refusal(e.code, e.message, field=field) from None


def _approve(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Approve a waiting request (``state.request``): it joins the queue, or is granted now.
    ``cmd.duration`` may only shorten what was asked; ``cmd.offer`` may only be a smaller one
    of the same kind. A request the pool would refuse now still awaits a decision."""
    note = approval_note(cmd.note, cmd.duration)
    facts, alloc = state.leases[cmd.lease_id], state.alloc
    refusal = not_awaiting(facts)
    if refusal is not None:
        raise refusal
    asked = state.asked_duration
    if cmd.duration is not None and asked is not None and cmd.duration > asked:
        raise Refusal(
            "invalid_field",
            f"an approval may shorten the duration asked ({asked:g} s), not lengthen it",
            field="duration",
        )
    duration = cmd.duration if cmd.duration is not None else asked
    assert state.request is not None  # the store reads it with the row
    request = state.request
    if cmd.offer is not None and cmd.offer != facts.offer:
        _check_smaller(alloc, facts.offer, cmd.offer)
        request = replace(request, offer=cmd.offer)
    decision = alloc.decide(request, now)
    if isinstance(decision, Rejected):  # nothing changed: it still awaits a decision
        raise Refusal(
            decision.code,
            f"{decision.message} (the request still awaits a decision)",
            field=decision.field,
            allowed=decision.allowed,
        )
    approved = RequestApproved(cmd.lease_id, duration, request.offer, note, decision.units)
    joins = LeaseGranted(decision) if isinstance(decision, Grant) else LeaseQueued(decision)
    return Outcome(cmd.lease_id, (approved, joins))


def _check_smaller(alloc: Allocator, asked: str, offer: str) -> None:
    """An approval may lower the ask to a smaller offer of the same kind, nothing else."""
    new, old = alloc.offers.get(offer), alloc.offers.get(asked)
    if new is None:
        raise Refusal(
            "unknown_offer",
            f"there is no offer {offer!r}",
            field="offer",
            allowed=list(alloc.offers),
        )
    smaller = [
        o.name
        for o in alloc.offers.values()
        if old is not None
        and o.kind == old.kind
        and o.name != old.name
        and alloc.units_for(o, None) < alloc.units_for(old, None)
    ]
    if offer not in smaller:
        raise Refusal(
            "invalid_field",
            f"an approval may lower the ask to a smaller offer of the same kind than "
            f"{asked!r}, not {offer!r}",
            field="offer",
            allowed=smaller,
        )


def denial_reason(reason: object) -> str:
    """The reason of a denial, which the user reads: said, and at most ``MAX_REASON``."""
    said = reason.strip() if isinstance(reason, str) else ""
    if not said:
        raise Refusal("missing_field", "say why the request is denied", field="reason")
    if len(said) > MAX_REASON:
        raise Refusal("invalid_field", f"at most {MAX_REASON} characters", field="reason")
    return said


def _deny(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Deny a request awaiting approval, with a reason the user sees: it ends (``denied``)
    and the queue is served (it held nothing, but may have kept nobody waiting)."""
    reason = denial_reason(cmd.reason)
    facts = state.leases[cmd.lease_id]
    refusal = not_awaiting(facts)
    if refusal is not None:
        raise refusal
    ended = finishing(state, [(facts, "denied")], now)
    return Outcome(cmd.lease_id, (RequestDenied(cmd.lease_id, reason), *ended))


def _lapse(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Approved time running out (``state.lapsing``): a bound lease whose duration ends
    within its ``warn_before`` gets an ``exception`` notice ending then (never less than
    ``warn_before`` from now: a notice always comes first; an earlier notice stands, and
    none while a reclaim is being carried out); a request still queued, or a grant never
    bound, when its duration ends is released ``lapsed``. Answers (noticed, lapsed)."""
    ending: list[tuple[LeaseFacts, str]] = []
    notices: list[Effect] = []
    for item in state.lapsing:
        facts = item.lease
        if facts.state in ("queued", "granted"):
            if item.lapses <= now:
                ending.append((facts, "lapsed"))
            continue
        if facts.claimed_at is not None or facts.reclaim_kind == "exception":
            continue
        if now < item.lapses - item.warn_before:
            continue
        deadline = max(item.lapses, now + item.warn_before)
        earlier = item.notice_deadline
        if facts.state == "reclaiming" and earlier is not None and earlier <= deadline:
            continue  # an earlier notice stands; this one comes if it is kept
        why = f"the approved time for this GPU ends at {format_epoch(math.floor(item.lapses))}"
        notice = Reclaiming("exception", deadline, why, "stop", now)
        notices += admin_notice(state, facts, item.reclaim, notice, now).effects
    ended = finishing(state, ending, now, "lapsed") if ending else ()
    return Outcome((len(notices), len(ending)), (*notices, *ended))


RULES: dict[type[c.Command], Rule] = {
    c.Approve: _approve,
    c.Deny: _deny,
    c.LapseApprovals: _lapse,
}
