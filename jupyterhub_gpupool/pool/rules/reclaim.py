"""Idle-GPU reclamation: a reclaimer's round (``plan_reclaims`` on what the store gathered, each
decision an effect, a shrink's target reserved make-before-break), the outcome of a claimed
action (the reclaimer's, or the service's own for an overdue notice) and the administrator's
reclaim policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ...timeparse import epoch_moment, format_time
from .. import commands as c
from ..effects import (
    AwaitingApproval,
    Effect,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    ReclaimCancelled,
    ReclaimClaimed,
    ReclaimCounted,
    ReclaimEnded,
    ReclaimNoticed,
    ReclaimPolicyReset,
    ReclaimPolicySet,
    WaitReason,
)
from ..ending import finishing
from ..errors import ConfigError, PoolError, Refusal
from ..facts import Outcome, PoolState, Rule
from ..leases import LIVE_STATES
from ..noticefacts import Noticed
from ..reclaim import (
    Act,
    Cancel,
    Decision,
    NoAction,
    Notice,
    ReclaimState,
    notice_words,
    parse_duration,
    parse_policies,
    plan_reclaims,
)
from ..reclaimpolicy import DURATION_FIELDS
from ..trial import Trial
from . import leases as lease_rules

#: The outcomes a reclaimer reports.
FINISHED_RESULTS = ("done", "failed")
#: The longest duration a policy may name (a year): deadlines stay within the calendar.
MAX_DURATION = 366 * 86400.0


@dataclass(frozen=True)
class Said:
    """What a round says of one lease (the store adds who holds it): its decision's ``kind``,
    the ``reason`` and the rest (None values are left out; a ``deadline`` is an aware UTC
    ``datetime``: the service alone writes it as text)."""

    lease: str
    kind: str
    reason: str
    extra: Mapping[str, Any]


# -- a round ---------------------------------------------------------------------------------


def _round(state: PoolState, cmd: Any, now: float) -> Outcome:
    """One window of every watched lease (``state.watched``, ``state.signals``): the pure
    rules' decision of each as an effect, then the leases whose action is claimed
    (``state.claimed``): waited for, or handed out again once the claim is older than
    ``state.claim_timeout``. Answers one ``Said`` each, in that order."""
    alloc, policies = state.alloc, state.policies
    assert policies is not None  # the store reads them
    decisions = plan_reclaims(
        list(state.watched),
        state.signals,
        policies,
        alloc.queue(now),
        alloc.quotas,
        now,
        offers=alloc.offers,
        stale_after=state.stale_after,
    )
    offers = {info.id: info.offer for info in state.watched}
    effects: list[Effect] = []
    said: list[Said] = []
    with Trial(alloc) as trial:  # a shrink's grant is there for the next shrink
        for d in decisions:
            said.append(_decided(state, trial, d, offers[d.lease], now, effects))
        said += [_claimed(state, n, now, effects) for n in state.claimed]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(tuple(said), tuple(effects))


def _decided(
    state: PoolState, trial: Trial, d: Decision, offer: str, now: float, effects: list[Effect]
) -> Said:
    evidence = asdict(d.evidence) if d.evidence is not None else None
    if isinstance(d, Act):
        return _act(state, trial, d, evidence, now, effects)
    if isinstance(d, Notice):
        rec = d.reclaiming
        effects.append(ReclaimNoticed(d.lease, d.state, evidence))
        assert state.policies is not None
        policy = state.policies.for_offer(state.alloc.offers.get(offer) or offer)
        words = notice_words(rec.kind, d.state.extensions, policy.max_extensions, False)
        extra = {
            "action": rec.action,
            "deadline": epoch_moment(rec.deadline),
            "evidence": evidence,
            "notice_kind": rec.kind,
            "heading": words["heading"],
            "keep": words["keep"],
            "why_not_kept": words["why_not_kept"],
        }
        return Said(d.lease, "notice", rec.reason, extra)
    if isinstance(d, Cancel):
        effects.append(ReclaimCancelled(d.lease, d.state, d.reason, evidence))
        return Said(d.lease, "cancel", d.reason, {"evidence": evidence})
    assert isinstance(d, NoAction)
    effects.append(ReclaimCounted(d.lease, d.state))
    return Said(d.lease, d.kind, d.reason, {"evidence": evidence})


def _act(
    state: PoolState,
    trial: Trial,
    d: Act,
    evidence: dict[str, Any] | None,
    now: float,
    effects: list[Effect],
) -> Said:
    """Claim the action; a shrink first reserves its target (make-before-break), and waits
    under notice while the smaller offer cannot be had at once."""
    target: str | None = None
    shrink_to = d.action.partition(":")[2] if d.action.startswith("shrink:") else None
    if shrink_to:
        try:
            asked = _shrink(state, d.lease, shrink_to, now)
        except Refusal as e:
            why = f"{d.action} is not possible now ({e.message}); the notice stays"
            return Said(d.lease, "deferred", why, {"action": d.action, "evidence": evidence})
        effects += asked
        first = asked[0]
        if isinstance(first, (LeaseQueued, AwaitingApproval)):  # no room now: not now
            if isinstance(first, LeaseQueued):
                tid, was = first.queued.request.id, "queued"
            else:
                tid, was = first.request.id, "awaiting_approval"
            effects.append(LeaseReleased(tid, "cancelled", was))
            effects += [LeaseGranted(g) for g in trial.promote(now)]
            why = f"{shrink_to} has no room now; the notice stays until it has"
            return Said(d.lease, "deferred", why, {"action": d.action, "evidence": evidence})
        assert isinstance(first, LeaseGranted)
        trial.grant(first.grant)
        target = first.grant.request.id
    data = {
        "action": d.action,
        "reason": d.reason,
        "release_reason": d.release_reason,
        "target_lease": target,
        "evidence": evidence,
    }
    effects.append(ReclaimClaimed(d.lease, d.release_reason, target, data, d.state))
    rec = d.state.reclaiming
    extra = {
        "action": d.action,
        "deadline": epoch_moment(rec.deadline if rec is not None else None),
        "release_reason": d.release_reason,
        "target_offer": shrink_to,
        "target_lease": target,
        "evidence": evidence,
    }
    return Said(d.lease, "act", d.reason, extra)


def _shrink(state: PoolState, lease_id: str, offer: str, now: float) -> tuple[Effect, ...]:
    """A shrink's target, as ``commands.Resize`` asks it (no cap on requests: the pool asks):
    refused for a cluster the pool no longer knows, as a resize is."""
    facts = state.leases[lease_id]
    for cluster in facts.clusters:
        if cluster not in state.clusters:
            raise Refusal(
                "unknown_cluster",
                f"unknown cluster {cluster!r}: the pool knows {', '.join(state.clusters)}",
                field="clusters",
                allowed=list(state.clusters),
            )
    shrink = state.shrinks[lease_id]
    asking = replace(state, new_id=shrink.new_id, resize_pending=shrink.pending, holder=None)
    rule = lease_rules.RULES[c.Resize]
    return rule(asking, c.Resize(lease_id, offer, check_cap=False), now).effects


def _claimed(state: PoolState, n: Noticed, now: float, effects: list[Effect]) -> Said:
    """A lease whose action was claimed: wait for its outcome, or hand the action out again
    once the claim is older than ``state.claim_timeout``."""
    facts = n.lease
    assert n.acting is not None
    if now - n.acting < state.claim_timeout:
        since = format_time(n.since)  # the reason's words
        return Said(facts.id, "none", f"being reclaimed ({n.action}) since {since}", {})
    data = {"action": n.action, "again": True, "claimed": n.since}
    effects.append(ReclaimClaimed(facts.id, facts.reclaim_release, facts.reclaim_target, data))
    extra = {
        "action": n.action,
        "deadline": n.deadline,
        "release_reason": facts.reclaim_release,
        "target_offer": (n.action or "").partition(":")[2] or None,
        "target_lease": facts.reclaim_target,
    }
    return Said(facts.id, "act", n.reason or "", extra)


# -- the outcome of an action ----------------------------------------------------------------


def check_result(result: str) -> None:
    """A reclaimer reports ``done`` or ``failed``."""
    if result not in FINISHED_RESULTS:
        raise Refusal(
            "invalid_field", f"unknown result {result!r}", field="result", allowed=FINISHED_RESULTS
        )


def acting(state: PoolState, lease_id: str) -> Noticed:
    """The lease whose claimed reclaim is being carried out (``not_acting`` otherwise)."""
    n = next((n for n in state.noticed if n.lease.id == lease_id), None)
    if n is None or n.acting is None:
        raise Refusal(
            "not_acting", f"no reclaim of lease {lease_id} is being carried out", field="id"
        )
    return n


def outcome_data(n: Noticed, outcome: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The audit data of a reclaim's outcome: what was claimed, and how it ended."""
    return {
        "kind": n.lease.reclaim_kind,
        "action": n.action,
        "reason": n.reason,
        "release_reason": n.lease.reclaim_release,
        **extra,
        "detail": detail,
        "outcome": outcome,
    }


def _outcome(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The reclaimer carried out (``done``) or could not carry out (``failed``) a claimed
    action: the lease is released with its claimed reason (the queue served), or goes back
    to its user (its counts start again, its shrink target cancelled)."""
    check_result(cmd.result)
    n = acting(state, cmd.lease_id)
    facts, saved = n.lease, [str(p) for p in cmd.saved]
    data = outcome_data(n, cmd.result, cmd.detail, target_lease=facts.reclaim_target, saved=saved)
    effects: list[Effect] = []
    if cmd.result == "done":
        if facts.state in LIVE_STATES:
            effects += finishing(state, [(facts, facts.reclaim_release or "reclaimed-idle")], now)
        effects.append(ReclaimEnded(facts.id, "reclaimed", data))
        return Outcome(cmd.lease_id, tuple(effects))
    target = state.leases.get(facts.reclaim_target) if facts.reclaim_target else None
    if target is not None and target.state in ("queued", *LIVE_STATES):
        effects += finishing(state, [(target, "cancelled")], now)
    # the user keeps the GPU; the counts start again (with the grace after work)
    back = ReclaimState(last_busy=now) if facts.state in LIVE_STATES else None
    effects.append(ReclaimEnded(facts.id, "reclaim-failed", data, forgotten=True, state=back))
    return Outcome(cmd.lease_id, tuple(effects))


def _enforced(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The service stopped the server of a notice it claimed (``cmd.stopped``): the lease is
    released with the claimed reason (``admin`` if none), unless its stop released it
    already. Not stopped: the claim stays (tried again once it is older than the claim
    timeout)."""
    n = acting(state, cmd.lease_id)
    facts = n.lease
    data = {**outcome_data(n, "done" if cmd.stopped else "failed", cmd.detail), "enforced": True}
    if not cmd.stopped:
        return Outcome(cmd.lease_id, (ReclaimEnded(facts.id, "reclaim-failed", data, False),))
    effects: list[Effect] = []
    if facts.state in LIVE_STATES:
        effects += finishing(state, [(facts, facts.reclaim_release or "admin")], now)
    effects.append(ReclaimEnded(facts.id, "reclaimed", data))
    return Outcome(cmd.lease_id, tuple(effects))


# -- the administrator's policy --------------------------------------------------------------


def _check_bounds(section: Mapping[str, Any]) -> None:
    """Every duration of the section within ``MAX_DURATION`` (errors name the field)."""
    levels: list[tuple[str, object]] = [("reclaim.default", section.get("default"))]
    for group in ("priority_classes", "offers"):
        for name, body in (section.get(group) or {}).items():
            levels.append((f"reclaim.{group}.{name}", body))
    for where, body in levels:
        # parse_policies has checked the shape: each level is a mapping or absent
        for key, value in body.items() if isinstance(body, Mapping) else ():
            name = f"{where}.{key}"
            too_long = key in DURATION_FIELDS and value is not None
            if too_long and parse_duration(value, name) > MAX_DURATION:
                raise ConfigError("must be at most 366 days", field=name)


def _put_policy(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Replace the ``reclaim`` section: checked against today's offers (a refusal names
    ``reclaim.<level>.<field>``); it wins over the pool config file until reset."""
    section = cmd.section
    try:
        parse_policies(section, state.alloc.offers, catalog=state.catalog)
        _check_bounds(section)
    except PoolError as e:
        message = e.message
        if e.allowed is not None and " (allowed:" in message:
            message = message[: message.rfind(" (allowed:")]
        raise Refusal(
            "invalid_field", message, field=e.field or "reclaim", allowed=e.allowed
        ) from None
    return Outcome(None, (ReclaimPolicySet(dict(section)),))


def _reset_policy(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Drop the administrator's section (if there is one): the config file's applies."""
    return Outcome(None, (ReclaimPolicyReset(),) if state.policy_override else ())


RULES: dict[type[c.Command], Rule] = {
    c.ReclaimRound: _round,
    c.ReclaimOutcome: _outcome,
    c.NoticeEnforced: _enforced,
    c.PutReclaimPolicy: _put_policy,
    c.ResetReclaimPolicy: _reset_policy,
}
