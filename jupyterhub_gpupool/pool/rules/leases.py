"""The lease lifecycle: a new request, a release, an expiry, a holder's keepalive, a resize, the
hub's reconcile, a queue pass."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...timeparse import format_time
from .. import commands as c
from ..approval import AskError, approval_needed, check_ask
from ..decisions import Grant, Rejected
from ..effects import (
    AwaitingApproval,
    Effect,
    KeptAlive,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    NewLease,
    NoticeExtended,
    RestartMarked,
)
from ..ending import finishing, serve_queue
from ..errors import PoolError, Refusal
from ..facts import LeaseFacts, Outcome, PoolState, Rule
from ..holders import orphans, refuse_for_job
from ..leases import LIVE_STATES
from ..model import Request, offer_priority
from ..reclaim import Extend, Refuse, keepalive


def allocate(state: PoolState, cmd: Any, now: float, workload: str | None = None) -> Outcome:
    """A new request: granted, queued, awaiting approval, or refused (a job's and a
    kernel's too: ``rules.jobs``, ``rules.kernels``; ``workload``: a job's class, which the
    allocator's headroom reads, ``pool.headroom``)."""
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
            workload=workload,
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
    return Outcome(cmd.lease_id, finishing(state, [(facts, reason)], now))


def _expire(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Release the grants no server bound in time (``state.leases``: the store found them
    by their ``expires``)."""
    ended = [(facts, "expired") for facts in state.leases.values()]
    return Outcome(len(ended), finishing(state, ended, now))


def _keepalive(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The lease's server runs: bind a ready grant (granted → active; binding a resize target
    ends the lease it replaces, make-before-break), or, under an idle notice, the user's "keep
    my GPU" (within the policy's extensions). A job's lease refuses: its runner binds it."""
    facts, lid = state.leases[cmd.lease_id], cmd.lease_id
    if refuse_for_job(facts.holder):
        raise _job_lease(facts, "keep it alive")
    if facts.state == "reclaiming" and facts.reclaim_kind is not None:
        if facts.claimed_at is not None:
            claimed = f"{facts.claimed_action}, claimed {format_time(facts.claimed_at)}"
            raise Refusal(
                "reclaim_in_progress",
                f"lease {lid} is being reclaimed now ({claimed}): too late to keep it",
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
            effects += finishing(state, [(old, "resized")], now)
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
    return allocate(replace(state, holder=None), ask, now)


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
    effects = finishing(state, ending, now, cmd.reason) if ending else ()
    return Outcome(len(gone), effects)


def _promote(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Serve the queue (aging changes its order over time); answers how many were granted."""
    return serve_queue(state.alloc, now)


def _mark_restarting(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The service is restarting the server into the lease, a granted resize target: the end
    of the lease it replaces then leaves it alone. Any other lease is left as it is (the
    restart may have lost a race with its end or its bind); answers the lease's id."""
    facts = state.leases[cmd.lease_id]
    if facts.state == "granted" and facts.resize_of is not None:
        return Outcome(cmd.lease_id, (RestartMarked(cmd.lease_id),))
    return Outcome(cmd.lease_id)


RULES: dict[type[c.Command], Rule] = {
    c.Allocate: allocate,
    c.Release: _release,
    c.Keepalive: _keepalive,
    c.Resize: _resize,
    c.Reconcile: _reconcile,
    c.ExpireGrants: _expire,
    c.Promote: _promote,
    c.MarkRestarting: _mark_restarting,
}
