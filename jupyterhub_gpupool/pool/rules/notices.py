"""Enforced notices and what an administrator does to a notice: reclaim a lease now or after a
grace, push a notice's deadline back, withdraw it; the service's own claim of an overdue
notice no reclaimer carried out; and a spent budget's notices (with the budget warnings)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from .. import commands as c
from ..effects import BudgetWarned, Effect, NoticeMoved, NoticeWithdrawn, ReclaimClaimed
from ..ending import admin_notice, finish, finishing
from ..errors import Refusal
from ..facts import LeaseFacts, Outcome, PoolState, Rule
from ..leases import LIVE_STATES
from ..noticefacts import Noticed
from ..quota import QuotaSpec, period_start
from ..reclaim import Reclaiming, enforced_release, withdraw

#: What an administrator's notice (a reclaim, a drain, a re-partition's) may do at its deadline.
ADMIN_ACTIONS = ("stop", "release-gpu")
#: The longest notice or extension an admin may give (a year, as for policies).
MAX_GRACE = 366 * 86400.0


def _only(state: PoolState, lease_id: str) -> Noticed:
    """The one lease the command addresses (the store gathered it)."""
    return next(n for n in state.noticed if n.lease.id == lease_id)


# -- reclaim now, extend, cancel -------------------------------------------------------------


def check_admin_reclaim(action: str, grace: float | None) -> None:
    """An admin's reclaim stops or releases the GPU, after 0 to 366 days."""
    if action not in ADMIN_ACTIONS:
        raise Refusal(
            "invalid_field", f"unknown action {action!r}", field="action", allowed=ADMIN_ACTIONS
        )
    if grace is not None and not 0 <= grace <= MAX_GRACE:
        raise Refusal("invalid_field", "must be 0 to 366 days in seconds", field="grace")


def _admin_reclaim(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Reclaim a live lease: a notice (kind ``admin``) ending in ``cmd.grace`` seconds (the
    offer's ``warn_before``: ``state.policy``), or (``immediately``) a release now with reason
    ``admin`` (the queue served). A grant not yet bound is released at once either way."""
    check_admin_reclaim(cmd.action, cmd.grace)
    n = _only(state, cmd.lease_id)
    facts = state.leases[cmd.lease_id]
    if facts.state not in LIVE_STATES:
        raise Refusal(
            "not_live",
            f"lease {cmd.lease_id} is {facts.state}: there is no GPU to reclaim",
            field="id",
        )
    if n.acting is not None and not cmd.immediately:
        raise Refusal(
            "reclaim_in_progress",
            f"lease {cmd.lease_id} is being reclaimed now ({n.action})",
            field="id",
        )
    if cmd.immediately:
        return finish(state, cmd.lease_id, "admin", now)
    grace = cmd.grace
    if grace is None:
        assert state.policy is not None  # the store reads the offer's
        grace = state.policy.warn_before
    why = cmd.reason.strip() or f"an administrator ({state.actor or 'admin'}) reclaims this GPU"
    notice = Reclaiming("admin", now + grace, why, cmd.action, now)
    return admin_notice(state, facts, n.reclaim, notice, now)


def check_seconds(seconds: float) -> None:
    """An extension of 1 s to 366 days."""
    if not 0 < seconds <= MAX_GRACE:
        raise Refusal("invalid_field", "must be 1 s to 366 days", field="seconds")


def _under_notice(n: Noticed, too_late: str) -> Reclaiming:
    """The lease's notice, refused when it has none or once its action is claimed."""
    lid, rec = n.lease.id, n.reclaim.reclaiming
    if n.lease.state != "reclaiming" or rec is None:
        raise Refusal("no_notice", f"lease {lid} is under no reclaim notice", field="id")
    if n.acting is not None:
        raise Refusal(
            "reclaim_in_progress", f"lease {lid} is being reclaimed now{too_late}", field="id"
        )
    return rec


def _extend(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Push a notice's deadline ``cmd.seconds`` later (from now, if it has passed)."""
    check_seconds(cmd.seconds)
    n = _only(state, cmd.lease_id)
    rec = _under_notice(n, ": too late to extend")
    after = replace(
        n.reclaim, reclaiming=replace(rec, deadline=max(rec.deadline, now) + cmd.seconds)
    )
    return Outcome(cmd.lease_id, (NoticeMoved(cmd.lease_id, after, cmd.seconds),))


def _cancel(state: PoolState, cmd: Any, now: float) -> Outcome:
    """An administrator withdraws a lease's notice, whatever its kind (the pool's
    ``withdraw``: ``state.policy``'s extension holds the next idle notice back)."""
    n = _only(state, cmd.lease_id)
    rec = _under_notice(n, ": too late to cancel its notice")
    who = state.actor.partition(":")[2] or state.actor or "admin"
    why = cmd.reason.strip() or f"an administrator ({who}) withdrew the notice"
    assert state.policy is not None  # the store reads the offer's
    after = withdraw(n.reclaim, now, state.policy.extension)
    return Outcome(cmd.lease_id, (NoticeWithdrawn(n.lease.id, after, why, rec.kind, rec.reason),))


# -- overdue notices, carried out by the service ---------------------------------------------


def check_overdue(overdue: float) -> None:
    if not 0 <= overdue <= MAX_GRACE:
        raise Refusal("invalid_field", "must be 0 to 366 days in seconds", field="overdue")


def unclaimed(noticed: Iterable[Noticed], now: float, claim_timeout: float) -> list[Noticed]:
    """The overdue notices no one is carrying out: not claimed, or claimed longer ago than
    ``claim_timeout`` (a claimer that died mid-action, as a round counts it)."""
    return [n for n in noticed if n.acting is None or n.acting <= now - claim_timeout]


def _enforce(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Claim each overdue enforced notice (``state.noticed``: the store found them by their
    deadline) no reclaimer acts on, for the service to stop its server, as a round claims
    an action (released with the notice's ``enforced_release``). Answers what to stop (its
    ``deadline`` an aware UTC ``datetime``)."""
    check_overdue(cmd.overdue)
    effects: list[Effect] = []
    out: list[dict[str, Any]] = []
    for n in unclaimed(state.noticed, now, state.claim_timeout):
        facts = n.lease
        release = enforced_release(facts.reclaim_kind or "admin")
        why = (
            f"no reclaimer carried out the {facts.reclaim_kind} notice within "
            f"{cmd.overdue:g} s of its deadline: the pool service stops the server"
        )
        data = {
            "kind": facts.reclaim_kind,
            "action": n.action,
            "reason": n.reason,
            "deadline": n.deadline,
            "release_reason": release,
            "enforced": why,
            "again": n.acting is not None,
        }
        effects.append(ReclaimClaimed(facts.id, release, facts.reclaim_target, data))
        out.append(
            {
                "lease": facts.id,
                "user": facts.user,
                "server": facts.server,
                "kind": facts.reclaim_kind,
                "action": n.action,
                "deadline": n.deadline,
                "reason": n.reason,
            }
        )
    return Outcome(out, tuple(effects))


# -- budgets ---------------------------------------------------------------------------------


def _budget(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Warn each user and group whose budget use crossed 80 % or 100 % this period (once per
    level and period: ``state.warned``), and give the live leases (``state.noticed``) of a
    spent ``stop`` budget a ``budget`` notice ending ``cmd.warn_before`` seconds from now
    (once; a grant not yet bound is released ``budget``, after the notices, the queue
    served). Answers the new warnings (``period_start``: an aware UTC ``datetime``)."""
    book, at = state.alloc.quotas, datetime.fromtimestamp(now, timezone.utc).replace(tzinfo=None)
    subjects: list[tuple[str, str, QuotaSpec, float]] = []
    users = {le.request.user for le in state.alloc.leases.values()} | set(book.users)
    for user in sorted(users):
        subjects.append(("user", user, book.user_spec(user), book.used_hours.get(user, 0.0)))
    for group, spec in sorted(book.groups.items()):
        subjects.append(("group", group, spec, book.used_hours.get(f"group:{group}", 0.0)))
    warnings: list[dict[str, Any]] = []
    effects: list[Effect] = []
    ending: list[tuple[LeaseFacts, str]] = []
    noticed: set[str] = set()
    for kind, name, spec, used in subjects:
        level = spec.budget_level(used)
        if level is None:
            continue
        start = period_start(at, spec.period)
        start = start.replace(tzinfo=timezone.utc)
        since = start.timestamp()
        if not any(w[:3] == (kind, name, level) and w[3] >= since for w in state.warned):
            warning = {
                "subject": kind,
                "name": name,
                "level": level,
                "used_unit_hours": round(used, 6),
                "budget": float(spec.budget or 0),
                "period": spec.period,
                "period_start": start,
                "action": spec.budget_action,
            }
            effects.append(BudgetWarned(warning))
            warnings.append(warning)
        if level == 100 and spec.budget_action == "stop":
            why = (
                f"the {float(spec.budget or 0):g} unit-hour budget of this {spec.period} "
                f"({kind} {name}) is spent: the server is stopped (your work is saved first)"
            )
            notice = Reclaiming("budget", now + cmd.warn_before, why, "stop", now)
            for n in state.noticed:
                facts = n.lease
                charged = facts.user if kind == "user" else facts.group
                if charged != name or facts.id in noticed or facts.reclaim_kind == "budget":
                    continue
                noticed.add(facts.id)
                if facts.state == "granted":  # nothing runs on it to warn: released
                    ending.append((state.leases[facts.id], enforced_release("budget")))
                    continue
                effects += admin_notice(state, facts, n.reclaim, notice, now).effects
    effects += finishing(state, ending, now) if ending else ()
    return Outcome(warnings, tuple(effects))


RULES: dict[type[c.Command], Rule] = {
    c.AdminReclaim: _admin_reclaim,
    c.ExtendNotice: _extend,
    c.CancelNotice: _cancel,
    c.EnforceNotices: _enforce,
    c.BudgetRound: _budget,
}
