"""The pool decides: ``decide(state, command, now) -> Outcome(answer, effects)``.

In the spirit of dask's ``handle_stimulus``, which returns instructions rather than doing
them: ``decide`` reads the pool state (``PoolState``: the allocator, plus the few facts of the
rows the rules need, which the store gathers first), changes nothing and does no I/O, and says
what is to happen as effects (``pool.effects``). The store's one applier makes them true in
one transaction (``store/apply.py``); the service serializes the answer. A refusal is raised
as a ``Refusal`` (its code, message, field and allowed values are the API's error body).

The commands decided here: ``Allocate``, ``Release``, ``Keepalive``, ``Resize``, ``Promote``,
``ExpireGrants``, ``Reconcile`` (the orphans of the hub's servers; the job runner timeout that
follows it is ``holders.runner_silent``), ``Approve``, ``Deny``, ``LapseApprovals``,
``SetNode``, ``SetSharing``, ``PutQuota``, ``PatchQuota`` and ``ResetQuota``. ``finish`` and
``serve_queue`` are the same rules for the store's other callers that end a lease or serve the
queue; ``admin_notice`` gives an enforced notice (an admin's, a drain's, a budget's, a
lapse's) for every caller that gives one; ``uncordon_withdrawals`` is the notices an uncordon
withdraws. The quota-edit preview is ``decide`` of ``PatchQuota`` with its effects read and
discarded (``quota_preview``). What differs by a lease's holder (a server, a job, a kernel) is
a rule of ``pool.holders`` these rules ask, never a store method of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from fractions import Fraction
from typing import Any

from . import commands as c
from .allocator import Allocator
from .approval import MAX_REASON, AskError, approval_needed, check_ask
from .decisions import Grant, Rejected
from .effects import (
    AwaitingApproval,
    BorrowedChanged,
    Effect,
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
    QuotaReset,
    QuotaSet,
    RequestApproved,
    RequestDenied,
    SharingSet,
    WaitReason,
)
from .errors import PoolError, Refusal
from .holders import Held, orphans, refuse_for_job
from .leases import LIVE_STATES
from .model import SHARING_MODES, Request, offer_priority
from .quota import QUOTA_FIELDS, QuotaSpec
from .reclaim import (
    Extend,
    LeaseInfo,
    Reclaiming,
    ReclaimPolicy,
    ReclaimState,
    Refuse,
    enforced_release,
    keepalive,
    withdraw,
    withdrawn_on_uncordon,
)
from .trial import Trial

#: ``LeaseFacts.reason`` of a granted resize target the service restarts the server into.
RESTARTING = "restarting"
#: What each node action sets (cordoned: takes nothing new; draining: the same, and says why).
NODE_ACTIONS: Mapping[str, Mapping[str, bool]] = {
    "cordon": {"cordoned": True},
    "uncordon": {"cordoned": False, "draining": False},
    "drain": {"draining": True},
}
#: Release reasons of a stop that a reclaim in progress caused (its own reason is kept).
_RECLAIM_STOPS = ("stopped", "resized", "orphaned")


@dataclass(frozen=True)
class LeaseFacts:
    """What the rules read of a lease's row beyond the allocator."""

    id: str
    user: str
    server: str
    state: str
    resize_of: str | None = None
    reason: str | None = None  # ``RESTARTING`` for a target the server restarts into
    reclaiming: bool = False  # a reclaim is acting on it (its stop is the reclaim's)
    reclaim_release: str | None = None  # the reason that reclaim's release is recorded with
    reclaim_target: str | None = None  # the shrink target a reclaim restarts it into
    targets: tuple[LeaseFacts, ...] = ()  # its resize targets not yet bound
    holder: str | None = None  # ``pool.holders``: None (a hub server), ``job`` or ``kernel``
    offer: str = ""
    group: str | None = None
    groups: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    hub: str | None = None
    ready: bool = True  # each of its MIG instances exists (a grant may be bound)
    reclaim_kind: str | None = None  # the kind of the notice it is under, if any
    claimed: str = ""  # a claimed reclaim's action and time, for the refusal's words
    reclaim: LeaseInfo | None = None  # its reclaim view (under a notice: what keepalive reads)
    release_reason: str | None = None  # why it ended, if it has


@dataclass(frozen=True)
class Lapsing:
    """A lease or request approved for a while (``LapseApprovals``), as the rule reads it."""

    lease: LeaseFacts
    lapses: float  # when the approved duration ends
    warn_before: float  # the notice's lead (its offer's policy)
    reclaim: ReclaimState = field(default_factory=ReclaimState)
    notice_deadline: float | None = None  # the deadline of the notice it is under, if any


@dataclass(frozen=True)
class Holder:
    """The lease or request a server already has."""

    id: str
    state: str
    hub: str | None


@dataclass(frozen=True)
class PoolState:
    """A read-only view of the pool for one decision."""

    alloc: Allocator
    #: The leases a release or an expiry addresses (with their pending targets).
    leases: Mapping[str, LeaseFacts] = field(default_factory=dict)
    #: Allocate: the lease or request the server already has, if any.
    holder: Holder | None = None
    #: Allocate: the user's requests awaiting approval, and the cap on live requests (0: none).
    awaiting: int = 0
    request_cap: int = 0
    #: Allocate: the id of the new request (drawn by the store: decide draws nothing).
    new_id: str = ""
    #: PatchQuota: the quota in effect now (its fields by name).
    quota: Mapping[str, Any] | None = None
    #: ResetQuota: whether an API override is in effect, and the config file's quota.
    quota_override: bool = False
    file_quota: QuotaSpec | None = None
    #: Keepalive: the reclaim policy of the lease's offer (read only under a notice).
    policy: ReclaimPolicy | None = None
    #: Resize: the live target the lease already has, if any.
    resize_pending: str | None = None
    #: Reconcile: the leases it looks at (the pool's own hub's, in the audit log's order),
    #: and (user, ``job:<id>``) of each live job.
    held: tuple[Held, ...] = ()
    jobs_alive: frozenset[tuple[str, str]] = frozenset()
    #: Approve: the request as asked (its ``Request``) and the duration asked, if any.
    request: Request | None = None
    asked_duration: float | None = None
    #: SetNode: the node is known; an uncordon's drain notices (``uncordon_withdrawals``).
    node_known: bool = False
    drained: tuple[tuple[LeaseFacts, ReclaimState, float], ...] = ()
    #: SetSharing: the node's GPUs (uuid, sharing mode now, MIG enabled), in its order.
    node_gpus: tuple[tuple[str, str, bool], ...] = ()
    #: LapseApprovals: the leases and requests whose approved duration ends some time.
    lapsing: tuple[Lapsing, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What a command answers (before serialization) and the effects that make it true."""

    answer: Any
    effects: tuple[Effect, ...] = ()


def decide(state: PoolState, command: c.Command, now: float) -> Outcome:
    """Decide ``command`` on ``state`` at ``now`` (epoch seconds); changes nothing."""
    rule = _RULES.get(type(command))
    if rule is None:
        raise ValueError(f"{type(command).__name__} is not decided by pool.decide yet")
    return rule(state, command, now)


# -- the lease lifecycle ------------------------------------------------------------------------


def _allocate(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A new request: granted, queued, awaiting approval, or refused."""
    alloc, new = state.alloc, NewLease(cmd.hub, cmd.resize_of)
    try:
        reason = check_ask(cmd.reason, cmd.duration)
    except AskError as e:
        raise Refusal(e.code, e.message, field=e.field) from None
    holder = state.holder
    if cmd.resize_of is None and holder is not None:  # one lease per server
        if holder.hub != cmd.hub:  # user names are the pool's keys
            raise Refusal(
                "already_allocated",
                f"server {cmd.user}/{cmd.server} already has a lease through another hub "
                "this pool serves (a user of the same name there): user names are "
                "the pool's keys, so keep them unique across its hubs",
                field="server",
            )
        raise Refusal(
            "already_allocated",
            f"server {cmd.user}/{cmd.server} already has lease {holder.id} ({holder.state})",
            field="server",
        )
    if cmd.check_cap and state.request_cap:
        live = len(alloc.leases_of(cmd.user)) + state.awaiting
        live += sum(1 for w in alloc.waiters.values() if w.request.user == cmd.user)
        if live >= state.request_cap:
            raise Refusal(
                "too_many_requests",
                f"{cmd.user} already has {live} GPU requests (queued, granted or held); "
                f"at most {state.request_cap} at once",
                field="user",
            )
    priority = cmd.priority
    if priority is None:
        priority = offer_priority(alloc.offers.get(cmd.offer))
    try:
        request = Request(
            state.new_id,
            cmd.user,
            cmd.offer,
            cmd.server,
            cmd.group,
            tuple(cmd.groups),
            priority,
            now,
            tuple(dict.fromkeys(cmd.clusters)),
            replicas=cmd.replicas,
        )
    except PoolError as e:  # a refusal of this call alone, even inside a batch
        raise Refusal(e.code, e.message, field=e.field) from None
    decision = alloc.decide(request, now)
    try:
        ask = approval_needed(alloc, request, decision, reason, cmd.duration, now)
    except AskError as e:
        raise Refusal(e.code, e.message, field=e.field, allowed=e.allowed) from None
    if ask is not None:
        return Outcome(request.id, (AwaitingApproval(request, ask, reason, cmd.duration, new),))
    if isinstance(decision, Rejected):
        raise Refusal(
            decision.code, decision.message, field=decision.field, allowed=decision.allowed
        )
    if isinstance(decision, Grant):
        return Outcome(request.id, (LeaseGranted(decision, new),))
    return Outcome(request.id, (LeaseQueued(decision, new),))


def _release(state: PoolState, cmd: Any, now: float) -> Outcome:
    """End a lease (or leave the queue, or withdraw a request) and serve the queue."""
    facts = state.leases[cmd.lease_id]
    if facts.state == "released":
        return Outcome(cmd.lease_id)
    reason = cmd.reason
    if reason == "stopped":  # a stop before anything was held
        reason = {"queued": "cancelled", "awaiting_approval": "withdrawn"}.get(facts.state, reason)
    return Outcome(cmd.lease_id, _finishing(state, [(facts, reason)], now))


def _expire(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Release the grants no server bound in time (``state.leases``: the store found them
    by their ``expires``)."""
    ended = [(facts, "expired") for facts in state.leases.values()]
    return Outcome(len(ended), _finishing(state, ended, now))


def _keepalive(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The lease's server runs: bind a ready grant (granted → active; binding a resize target
    ends the lease it replaces, make-before-break), or, under an idle notice, the user's "keep
    my GPU" (within the policy's extensions). A job's lease refuses: its runner binds it."""
    facts, lid = state.leases[cmd.lease_id], cmd.lease_id
    if refuse_for_job(facts.holder):
        raise _job_lease(facts, "keep it alive")
    if facts.state == "reclaiming" and facts.reclaim_kind is not None:
        if facts.claimed:
            raise Refusal(
                "reclaim_in_progress",
                f"lease {lid} is being reclaimed now ({facts.claimed}): too late to keep it",
                field="id",
            )
        assert facts.reclaim is not None and state.policy is not None  # the store reads both
        d = keepalive(facts.reclaim, state.policy, now)
        if isinstance(d, Refuse):
            allowed = [d.limit] if d.limit is not None else None
            raise Refusal(d.code, d.message, field="id", allowed=allowed)
        if isinstance(d, Extend):
            return Outcome(lid, (NoticeExtended(lid, d.state, d.extensions, d.limit, d.until),))
    if facts.state in ("awaiting_approval", "queued", "released"):
        raise Refusal("not_live", f"lease {lid} is {facts.state}", field="id")
    if facts.state == "granted" and not facts.ready:  # dynamic MIG: nothing to run on yet
        raise Refusal(
            "not_ready",
            f"lease {lid} waits for its MIG instance to be made; bind it once the lease is ready",
            field="id",
        )
    effects: list[Effect] = [KeptAlive(lid)]
    if facts.state == "granted":
        effects.append(LeaseActivated(lid))
        old = state.leases.get(facts.resize_of) if facts.resize_of else None
        if old is not None and old.state != "released":
            effects += _finishing(state, [(old, "resized")], now)
    return Outcome(lid, tuple(effects))


def _resize(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Reserve ``cmd.offer`` for the lease's server: a new request (``Allocate``) that will
    replace the lease once bound. A lease has at most one live target, and a target cannot be
    resized before it is bound (``resize_target``), so targets never chain."""
    facts, lid = state.leases[cmd.lease_id], cmd.lease_id
    if refuse_for_job(facts.holder):
        raise _job_lease(facts, "resize it")
    original = state.leases.get(facts.resize_of) if facts.resize_of else None
    if facts.state != "released" and original is not None and original.state != "released":
        raise Refusal(
            "resize_target",
            f"lease {lid} is the pending resize of lease {facts.resize_of}: "
            "resize that one, or wait until this one is bound",
            field="id",
        )
    if facts.state not in LIVE_STATES:
        raise Refusal("not_live", f"lease {lid} is {facts.state}", field="id")
    if cmd.offer == facts.offer:
        raise Refusal("same_offer", f"lease {lid} already has {cmd.offer!r}", field="offer")
    if state.resize_pending is not None:
        raise Refusal(
            "resize_pending",
            f"lease {lid} already has resize {state.resize_pending} pending",
            field="id",
        )
    ask = c.Allocate(
        facts.user,
        facts.server,
        cmd.offer,
        group=facts.group,
        groups=facts.groups,
        resize_of=lid,
        clusters=facts.clusters,
        hub=facts.hub,  # the restart into it is that hub's
        check_cap=cmd.check_cap,
    )
    return _allocate(replace(state, holder=None), ask, now)


def _job_lease(facts: LeaseFacts, what: str) -> Refusal:
    return Refusal(
        "job_lease",
        f"lease {facts.id} is held by {facts.server}: its runner and the jobs endpoints act "
        f"on it; cancel the job instead of trying to {what}",
        field="id",
    )


def _reconcile(state: PoolState, cmd: Any, now: float) -> Outcome:
    """End what nothing holds any more (``holders.orphans`` of ``state.held``: the store read
    them, with the live jobs, first); answers how many."""
    deleted = frozenset(cmd.deleted)
    gone = orphans(state.held, cmd.running, deleted, state.jobs_alive, cmd.reason)
    ending = [(state.leases[lid], why) for lid, why in gone]
    effects = _finishing(state, ending, now, cmd.reason) if ending else ()
    return Outcome(len(gone), effects)


def uncordon_withdrawals(
    node: str, leases: Iterable[tuple[LeaseFacts, ReclaimState, float]], now: float
) -> list[NoticeWithdrawn]:
    """The notices an uncordon of ``node`` withdraws: each drain notice of its leases
    ((facts, reclaim state, the policy's ``extension``)) that no one is carrying out yet."""
    out = []
    for facts, rs, hold in leases:
        rec = rs.reclaiming
        if facts.claimed or rec is None or not withdrawn_on_uncordon(facts.reclaim_kind):
            continue
        why = f"the node {node} is back in service: the drain is called off"
        out.append(NoticeWithdrawn(facts.id, withdraw(rs, now, hold), why, rec.kind, rec.reason))
    return out


# -- enforced notices and approvals ---------------------------------------------------------------


def admin_notice(
    state: PoolState, facts: LeaseFacts, rs: ReclaimState, notice: Reclaiming, now: float
) -> Outcome:
    """Give ``facts``' live lease the enforced ``notice`` (an administrator's, a drain's, a
    spent budget's, an approval's lapse; ``rs``: its reclaim state now). A grant not yet bound
    is released at once instead (``enforced_release``: nothing runs on it to warn), the queue
    served. A drain's deadline is never pushed back. Answers ``noticed`` or ``released``."""
    if facts.state == "granted":
        ended = _finishing(state, [(facts, enforced_release(notice.kind))], now)
        return Outcome("released", ended)
    rec = rs.reclaiming
    if rec is not None and notice.deadline > rec.deadline and facts.reclaim_kind == "drain":
        notice = replace(notice, deadline=rec.deadline)
    return Outcome("noticed", (NoticeGiven(facts.id, replace(rs, reclaiming=notice)),))


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
    ended = _finishing(state, [(facts, "denied")], now)
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
        if facts.claimed or facts.reclaim_kind == "exception":
            continue
        if now < item.lapses - item.warn_before:
            continue
        deadline = max(item.lapses, now + item.warn_before)
        earlier = item.notice_deadline
        if facts.state == "reclaiming" and earlier is not None and earlier <= deadline:
            continue  # an earlier notice stands; this one comes if it is kept
        why = f"the approved time for this GPU ends at {_to_the_second(item.lapses)}"
        notice = Reclaiming("exception", deadline, why, "stop", now)
        notices += admin_notice(state, facts, item.reclaim, notice, now).effects
    ended = _finishing(state, ending, now, "lapsed") if ending else ()
    return Outcome((len(notices), len(ending)), (*notices, *ended))


def _to_the_second(at: float) -> str:
    """An ISO time to the second (people read it), as the API writes times (``Z``)."""
    return (
        datetime.fromtimestamp(math.floor(at), timezone.utc).replace(tzinfo=None).isoformat() + "Z"
    )


# -- nodes ----------------------------------------------------------------------------------------


def _set_node(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Cordon, uncordon or drain a node (it keeps its leases either way). An uncordon gives
    the queue the node's room at once and withdraws the drain notices of its leases that no
    one is carrying out yet (``state.drained``); answers their ids."""
    flags = NODE_ACTIONS.get(cmd.action)
    if flags is None:
        raise Refusal(
            "not_found",
            f"no node action {cmd.action!r}",
            field="action",
            allowed=list(NODE_ACTIONS),
        )
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    cordoned, draining = flags.get("cordoned"), flags.get("draining")
    effects: list[Effect] = [NodeFlagsSet(cmd.name, cmd.action, cordoned, draining)]
    if cmd.action != "uncordon":
        return Outcome([], tuple(effects))
    with Trial(state.alloc) as trial:
        trial.set_node_flags(cmd.name, cordoned, draining)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    withdrawn = uncordon_withdrawals(cmd.name, state.drained, now)
    return Outcome([e.lease_id for e in withdrawn], (*effects, *withdrawn))


def _set_sharing(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A node's GPUs' sharing modes as its device plugin advertises them (uuid → mode; a MIG
    GPU's and an unnamed one's stay): leases keep what they hold, and the queue is served
    (a GPU now shared may take waiters). Answers what changed."""
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    changed: dict[str, str] = {}
    for uuid, sharing, mig in state.node_gpus:
        mode = cmd.modes.get(uuid)
        if mode is None or mode == sharing or mig:
            continue
        if mode not in SHARING_MODES:
            raise Refusal("invalid_field", f"unknown sharing mode {mode!r}")
        changed[uuid] = mode
    if not changed:
        return Outcome(changed)
    effects: list[Effect] = [SharingSet(cmd.name, tuple(changed.items()))]
    with Trial(state.alloc) as trial:
        for uuid, mode in changed.items():
            trial.set_gpu_sharing(uuid, mode)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(changed, tuple(effects))


def _promote(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Serve the queue (aging changes its order over time); answers how many were granted."""
    return serve_queue(state.alloc, now)


def finish(state: PoolState, lease_id: str, reason: str, now: float) -> Outcome:
    """End the lease ``state.leases[lease_id]`` for ``reason``, with what follows: the queue
    served with what it frees, the owner's borrowed flags re-derived, its pending resize
    targets ended (unless the server restarts into one). For every caller that ends a lease."""
    return Outcome(lease_id, _finishing(state, [(state.leases[lease_id], reason)], now))


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


def _finishing(
    state: PoolState,
    ending: list[tuple[LeaseFacts, str]],
    now: float,
    granted_ends: str | None = None,
) -> tuple[Effect, ...]:
    """End ``ending`` in order, in one trial. ``granted_ends``: the reason a queued request
    listed there ends with if the queue pass of an earlier one granted it meanwhile (it ends
    as the grant it now is, not ``cancelled``)."""
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


# -- quotas ---------------------------------------------------------------------------------------


def _put_quota(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Set a user's or group's quota by API (``cmd.kind``: ``users`` or ``groups``). Lowering
    it below current use is allowed: the leases beyond the new guarantee become borrowed."""
    raw = cmd.raw
    if isinstance(cmd, c.PatchQuota):  # only the fields named, over the quota in effect
        current = state.quota or {}
        raw = {**{k: current[k] for k in QUOTA_FIELDS}, **raw}
    kind = cmd.kind[:-1]
    spec = QuotaSpec.parse(raw, f"quotas.{cmd.kind}.{cmd.name}")
    flags = borrowed_if(state.alloc, kind, cmd.name, spec.guarantee)
    effects: list[Effect] = [BorrowedChanged(lid, b) for lid, b in flags]
    effects.append(QuotaSet(kind, cmd.name, spec))
    answer = {"name": cmd.name, "kind": kind, "source": "api", **spec.to_dict()}
    return Outcome(answer, tuple(effects))


def _reset_quota(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Drop a user's or group's API override (``state.quota_override``): the config file's
    quota (``state.file_quota``) applies, or none (a user gets the default). Answers None (the
    store answers the quota in effect after)."""
    if not state.quota_override:
        return Outcome(None)
    kind, spec, book = cmd.kind[:-1], state.file_quota, state.alloc.quotas
    guarantee = spec.guarantee if spec is not None else None
    if kind == "user" and guarantee is None:
        guarantee = book.default_user.guarantee
    flags = borrowed_if(state.alloc, kind, cmd.name, guarantee)
    effects: list[Effect] = [BorrowedChanged(lid, b) for lid, b in flags]
    effects.append(QuotaReset(kind, cmd.name, spec))
    return Outcome(None, tuple(effects))


def borrowed_if(
    alloc: Allocator, kind: str, name: str, guarantee: Fraction | None
) -> list[tuple[str, bool]]:
    """(lease id, borrowed) of each live lease whose flag giving user or group (``kind``)
    ``name`` the guarantee ``guarantee`` (None: a group with no quota) would change:
    ``borrowing.borrowed_flags`` over the leases of the user, or of the group's members, with
    the edited guarantee."""
    users = alloc._owners(name if kind == "user" else None, name if kind == "group" else None)
    flags = alloc._borrowed_now(
        users,
        user_guarantee={name: guarantee} if kind == "user" and guarantee is not None else {},
        group_guarantee={name: guarantee} if kind == "group" else {},
    )
    return [(lease.id, borrowed) for lease, borrowed in flags if borrowed != lease.borrowed]


def quota_preview(
    state: PoolState, kind: str, name: str, raw: Mapping[str, object]
) -> tuple[QuotaSpec, list[str], list[str]]:
    """What editing a quota (the fields of ``raw`` over the one in effect, ``state.quota``)
    would do, changing nothing: ``decide`` of ``PatchQuota`` with its effects read, never
    applied. Returns (the quota it would set, ids that would become borrowed, ids that would
    become within guarantee)."""
    effects = decide(state, c.PatchQuota(kind, name, raw), 0.0).effects
    spec = next(e.spec for e in effects if isinstance(e, QuotaSet))
    changes = [e for e in effects if isinstance(e, BorrowedChanged)]
    become_borrowed = [e.lease_id for e in changes if e.borrowed]
    return spec, become_borrowed, [e.lease_id for e in changes if not e.borrowed]


_RULES: dict[type[c.Command], Callable[[PoolState, Any, float], Outcome]] = {
    c.Allocate: _allocate,
    c.Release: _release,
    c.Keepalive: _keepalive,
    c.Resize: _resize,
    c.Reconcile: _reconcile,
    c.Approve: _approve,
    c.Deny: _deny,
    c.LapseApprovals: _lapse,
    c.SetNode: _set_node,
    c.SetSharing: _set_sharing,
    c.ExpireGrants: _expire,
    c.Promote: _promote,
    c.PutQuota: _put_quota,
    c.PatchQuota: _put_quota,
    c.ResetQuota: _reset_quota,
}

#: Commands ``decide`` decides (the others still decide inside their store method).
DECIDED = frozenset(_RULES)

__all__ = [
    "DECIDED",
    "NODE_ACTIONS",
    "RESTARTING",
    "Holder",
    "Lapsing",
    "LeaseFacts",
    "Outcome",
    "PoolState",
    "admin_notice",
    "approval_note",
    "decide",
    "denial_reason",
    "ended_reason",
    "finish",
    "not_awaiting",
    "quota_preview",
    "serve_queue",
    "uncordon_withdrawals",
]
