"""Idle-GPU reclamation as pure rules: signals and state in, decisions out, nothing read or written.

The reclaimer service reads the three signals of every live lease (GPU activity, the kernels of
the user's server, the user's presence) over a window, calls :func:`plan_reclaims` with the
lease's persisted :class:`ReclaimState`, and applies the one decision it gets back per lease
(persisting ``decision.state``). Time is whatever ``now`` says, so restarts and tests move it.

Idle is decided per window from the :data:`CASES` table (docs and tests read the same rows).
A window adds to an idle count or resets it, as Run:ai's 30 s windows do: any activity resets.
A count reaching its timeout brings a notice ``warn_before`` ahead of the action; the user may
extend (a bounded number of times); the notice is cancelled when the lease works again; the
action comes at the deadline. Stale or missing data never moves anything towards an action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from .borrowing import owner_surplus, reclaim_order
from .idlesignal import (
    CASES,
    GPU_STATES,
    KERNEL_STATES,
    MIG_IDLE_MEMORY_MIB,
    MIG_MEMORY_DELTA_MIB,
    PRESENCE_STATES,
    SIGNAL_SOURCES,
    VERDICTS,
    Case,
    GpuSample,
    KernelView,
    PresenceView,
    Signals,
    cases_markdown,
    classify,
    gpu_activity,
    gpu_signal_source,
    kernel_activity,
    presence_of,
    read_window,
    share_samples,
    share_signal_source,
    stale_reason,
)
from .model import Offer
from .queue import Waiter
from .quota import QuotaBook
from .reclaimpolicy import (
    POLICY_FIELDS,
    SHRINK_KINDS,
    PolicySet,
    ReclaimPolicy,
    parse_duration,
    parse_policies,
    parse_policy,
    shrink_problem,
)

#: What a notice is for: the idle timeout, the CPU-busy timeout, the maximum age, borrowed
#: capacity owed to a waiter within guarantee, an admin's "reclaim now", a node drain, or the
#: end of an approved exception.
NOTICE_KINDS = ("idle", "cpu", "max_age", "borrowed", "admin", "drain", "exception", "budget")
#: Notices an admin issued: no signal cancels or defers them, the user cannot keep the GPU
#: (an admin may extend them), and the lease is released with reason ``admin`` (``lapsed``
#: for an exception's end).
ADMIN_KINDS = ("admin", "drain", "exception", "budget")

#: Each notice kind's heading, as every surface shows it (Lab panel, widget, user page, hook).
NOTICE_HEADINGS = {
    "idle": "Idle GPU: it will be reclaimed",
    "cpu": "Idle GPU (the kernel works on the CPU): it will be reclaimed",
    "max_age": "Maximum age reached: this GPU will be reclaimed",
    "borrowed": "Borrowed GPU: someone within their guarantee needs it",
    "admin": "An administrator reclaims this GPU",
    "drain": "Node maintenance: this GPU's node is being drained",
    "exception": "Your approved extra time ends",
    "budget": "Budget spent: this GPU will be reclaimed",
}
#: Why a notice of each kind cannot be kept (the user's keepalive answers this too).
NOT_KEPT = {
    "borrowed": "it is borrowed beyond your guarantee and someone within theirs waits for it",
    "max_age": "the lease has reached its maximum age",
    "admin": "an administrator reclaims it (they can extend or cancel the notice)",
    "drain": "its node is drained for maintenance (an administrator can extend or cancel the "
    "notice)",
    "exception": "the time of your approved exception is over (ask for more to keep it)",
    "budget": "the GPU-hour budget it is charged to is spent (ask an administrator for more)",
}


def notice_words(
    kind: str, extensions: int, max_extensions: int, acting: bool
) -> dict[str, str | bool | None]:
    """What a notice says in every surface: its ``heading``, whether the user may keep the GPU
    (``keep``) and, if not, why (``why_not_kept``, a sentence ending without a full stop)."""
    why: str | None = None
    if acting:
        why = "the reclaim has started"
    elif kind in NOT_KEPT:
        why = NOT_KEPT[kind]
    elif max_extensions == 0:
        why = "the policy allows no extensions; use the GPU to keep it"
    elif extensions >= max_extensions:
        times = "once" if extensions == 1 else f"{extensions} times"
        why = f"kept {times} already, the most allowed; use the GPU to keep it"
    return {
        "heading": NOTICE_HEADINGS.get(kind, "This GPU will be reclaimed"),
        "keep": why is None,
        "why_not_kept": None if why is None else f"It cannot be kept: {why}",
    }


# -- lease state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reclaiming:
    """A lease's notice (the lease is ``reclaiming``): shown to the user, persisted."""

    kind: str
    deadline: float
    reason: str
    action: str
    issued_at: float
    pressure: bool = False
    for_request: str | None = None


@dataclass(frozen=True)
class ReclaimState:
    """What the reclaimer keeps per lease between windows (in the pool's database, so a
    restarted reclaimer keeps every count and deadline).

    ``idle_since`` starts the current run of ``idle`` windows, ``gpu_idle_since`` the current
    run of ``idle`` or ``idle-cpu`` windows; ``last_busy`` ends the last window with the GPU or
    a kernel busy; ``extensions`` counts keepalives since the GPU was last busy.
    """

    idle_since: float | None = None
    gpu_idle_since: float | None = None
    last_busy: float | None = None
    extensions: int = 0
    snooze_until: float | None = None
    reclaiming: Reclaiming | None = None
    #: An administrator withdrew a maximum-age notice: the next one waits until then (a
    #: user's keepalive never moves the maximum age).
    age_snooze_until: float | None = None


def observe(state: ReclaimState, case: Case, start: float, end: float) -> ReclaimState:
    """Count one window: ``active`` resets both counts, ``idle-cpu`` resets the idle count."""
    busy = case.gpu == "busy" or case.kernel in ("busy", "unknown")
    last_busy = end if busy else state.last_busy
    extensions = 0 if case.gpu == "busy" else state.extensions
    if case.verdict == "active":
        return replace(
            state, idle_since=None, gpu_idle_since=None, last_busy=last_busy, extensions=extensions
        )
    gpu_idle_since = start if state.gpu_idle_since is None else state.gpu_idle_since
    idle_since = (
        None
        if case.verdict == "idle-cpu"
        else (start if state.idle_since is None else state.idle_since)
    )
    return replace(state, idle_since=idle_since, gpu_idle_since=gpu_idle_since, last_busy=last_busy)


@dataclass(frozen=True)
class LeaseInfo:
    """A live lease as the reclaimer needs it: who holds what, since when, and its state."""

    id: str
    user: str
    offer: str
    units: Fraction
    granted_at: float
    group: str | None = None
    groups: tuple[str, ...] = ()
    borrowed: bool = False
    models: tuple[str, ...] = ()
    state: ReclaimState = field(default_factory=ReclaimState)


# -- decisions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """The signals a decision rests on (audit events carry it)."""

    gpu: str
    kernel: str
    presence: str
    verdict: str
    why: str
    idle_for: float = 0.0
    gpu_idle_for: float = 0.0
    pressure: bool = False


@dataclass(frozen=True, kw_only=True)
class _Decision:
    lease: str
    state: ReclaimState
    evidence: Evidence | None = None


@dataclass(frozen=True, kw_only=True)
class NoAction(_Decision):
    """Nothing to do now; ``reason`` says why (counting, active, stale, exempt, waiting)."""

    reason: str
    kind: str = "none"


@dataclass(frozen=True, kw_only=True)
class Notice(_Decision):
    """Enter ``reclaiming``: tell the user the deadline, the reason and the action."""

    reclaiming: Reclaiming
    kind: str = "notice"


@dataclass(frozen=True, kw_only=True)
class Extend(_Decision):
    """The user's keepalive: the notice ends and no new one comes before ``until``."""

    until: float
    extensions: int
    limit: int
    kind: str = "extend"


@dataclass(frozen=True, kw_only=True)
class Refuse(_Decision):
    """A keepalive that cannot extend (``code`` is a refusal code; ``limit`` the extensions)."""

    code: str
    message: str
    limit: int | None = None
    kind: str = "refuse"


@dataclass(frozen=True, kw_only=True)
class Cancel(_Decision):
    """The notice is withdrawn (the GPU got busy again, the user came back, nobody waits)."""

    reason: str
    kind: str = "cancel"


@dataclass(frozen=True, kw_only=True)
class Act(_Decision):
    """Carry out ``action`` now: save every open document first, then stop / shrink / restart
    without a GPU; release the lease with ``release_reason``."""

    action: str
    reason: str
    release_reason: str
    save_first: bool = True
    kind: str = "act"


Decision = NoAction | Notice | Extend | Refuse | Cancel | Act


def keepalive(lease: LeaseInfo, policy: ReclaimPolicy, now: float) -> Extend | Refuse | NoAction:
    """The user's "keep my GPU": ends an idle notice within ``max_extensions``; a borrowed or
    max-age notice cannot be extended, and the refusal says the limit."""
    state, rec = lease.state, lease.state.reclaiming
    if rec is None:
        return NoAction(lease=lease.id, state=state, reason="no notice to extend")
    if rec.kind in ("borrowed", "max_age", *ADMIN_KINDS):
        return Refuse(
            lease=lease.id,
            state=state,
            code="not_extendable",
            message=f"this GPU cannot be kept: {NOT_KEPT.get(rec.kind, NOT_KEPT['admin'])}",
        )
    if state.extensions >= policy.max_extensions:
        return Refuse(
            lease=lease.id,
            state=state,
            code="extension_limit",
            message=f"all {policy.max_extensions} extensions are used; use the GPU to keep it",
            limit=policy.max_extensions,
        )
    until = now + policy.extension
    new = replace(
        state,
        reclaiming=None,
        extensions=state.extensions + 1,
        snooze_until=until,
        idle_since=None,
        gpu_idle_since=None,
    )
    return Extend(
        lease=lease.id,
        state=new,
        until=until,
        extensions=new.extensions,
        limit=policy.max_extensions,
    )


def withdraw(state: ReclaimState, now: float, hold: float) -> ReclaimState:
    """An administrator withdraws the notice (any kind; an uncordon withdraws a drain's): the
    notice ends and the counts start again, and no idle, CPU or maximum-age notice comes
    before ``hold`` seconds from ``now`` (as after a keepalive; ``hold`` is the policy's
    ``extension``). A borrowed notice comes again at the next round someone within guarantee
    still waits for this hardware. The keepalives used so far are left as they are."""
    snooze = now + hold if state.snooze_until is None else max(state.snooze_until, now + hold)
    return replace(
        state,
        reclaiming=None,
        idle_since=None,
        gpu_idle_since=None,
        snooze_until=snooze,
        age_snooze_until=snooze,
    )


def withdrawn_on_uncordon(kind: str | None) -> bool:
    """Which notices an uncordon withdraws: a node's drain, nothing else (an admin's own
    reclaim or an exception's end stands until cancelled by itself)."""
    return kind == "drain"


# -- planning ------------------------------------------------------------------------------

#: ``serves(lease, offer, units, offers)``: would releasing ``lease`` make room for a waiter of
#: ``units`` of ``offer``? The default is :func:`serves`; the service may pass an exact one.
ServesFn = Callable[[LeaseInfo, Offer, Fraction, Mapping[str, Offer]], bool]


def serves(lease: LeaseInfo, wanted: Offer, units: Fraction, offers: Mapping[str, Offer]) -> bool:
    """Same kind of hardware, a model the waiter accepts (the lease's models, else its offer's),
    and at least the units it needs: a lease that alone makes room, so one reclaim serves one
    waiter and never more."""
    held = offers.get(lease.offer)
    if held is None or wanted.kind == "cpu" or held.kind != wanted.kind:
        return False
    if wanted.models and not set(lease.models or held.models) & set(wanted.models):
        return False
    return lease.units >= units


def _gpu_working(case: Case) -> bool:
    """The GPU is, or may be, computing: such a lease is never acted on."""
    return case.gpu == "busy" or (case.gpu == "unknown" and case.kernel != "idle")


def _h(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def _evidence(case: Case, state: ReclaimState, now: float, pressure: bool) -> Evidence:
    return Evidence(
        case.gpu,
        case.kernel,
        case.presence,
        case.verdict,
        case.why,
        idle_for=0.0 if state.idle_since is None else now - state.idle_since,
        gpu_idle_for=0.0 if state.gpu_idle_since is None else now - state.gpu_idle_since,
        pressure=pressure,
    )


def plan_reclaims(
    leases: Sequence[LeaseInfo],
    signals: Mapping[str, Signals],
    policies: PolicySet,
    queue: Sequence[Waiter],
    quotas: QuotaBook,
    now: float,
    *,
    offers: Mapping[str, Offer],
    pool_at: float | None = None,
    stale_after: float = 120.0,
    serves: ServesFn = serves,
) -> list[Decision]:
    """One decision per lease, in the order of ``leases``; persist each ``decision.state``.

    A share's window is read from its own processes' utilization where its GPU gave
    per-process samples (:func:`share_samples`), else from the whole GPU's.
    ``queue`` is the waiting requests in service order (``Allocator.queue``); waits for quota
    are ignored, since no reclaim can end them. ``pool_at`` is when the leases and the queue
    were read: older than ``stale_after``, nothing is counted or done, as for stale signals.
    """
    waiting = [w for w in queue if w.reason != "quota" and w.request.offer in offers]
    waiting_ids = {w.request.id for w in waiting}
    wants = {(w.request.offer, w.units) for w in waiting}  # distinct asks: one check each
    pool_stale = None
    if pool_at is not None and now - pool_at > stale_after:
        pool_stale = f"the pool's data is {now - pool_at:.0f} s old"
    out: dict[str, Decision] = {}
    cases: dict[str, Case] = {}
    for lease in leases:
        offer = offers.get(lease.offer)
        policy = policies.for_offer(offer or lease.offer)
        if lease.state.reclaiming is not None and lease.state.reclaiming.kind in ADMIN_KINDS:
            out[lease.id] = _admin_follow(lease, now)  # the admin decided, not the signals
            continue
        if offer is not None and offer.kind == "cpu":
            out[lease.id] = NoAction(lease=lease.id, state=lease.state, reason="no GPU to reclaim")
            continue
        sig = signals.get(lease.id)
        stale = pool_stale or stale_reason(sig, now, stale_after)
        if stale or sig is None:
            restarted = replace(lease.state, idle_since=None, gpu_idle_since=None)
            out[lease.id] = NoAction(
                lease=lease.id,
                state=restarted,
                reason=f"stale data, no action: {stale}",
                kind="stale",
            )
            continue
        if offer is not None and offer.kind == "shared":  # its own processes, not the GPU's
            sig = replace(
                sig, gpu=share_samples(sig.gpu, lease.id), source=share_signal_source(sig.gpu)
            )
        case = cases[lease.id] = read_window(sig, policy.gpu_idle_threshold)
        observed = replace(lease, state=observe(lease.state, case, sig.start, sig.end))
        pressure = any(serves(observed, offers[o], units, offers) for o, units in wants)
        out[lease.id] = _decide(observed, policy, case, pressure, now, waiting_ids)
    _reclaim_borrowed(leases, out, cases, policies, waiting, quotas, now, offers, serves)
    return [out[le.id] for le in leases]


def _decide(
    lease: LeaseInfo,
    policy: ReclaimPolicy,
    case: Case,
    pressure: bool,
    now: float,
    waiting: set[str],
) -> Decision:
    state, rec = lease.state, lease.state.reclaiming
    ev = _evidence(case, state, now, pressure)
    spared = policy.exempts(lease.user, lease.groups) or (
        None if policy.enabled else "reclaim is off"
    )
    if spared:
        if rec is not None:
            return Cancel(
                lease=lease.id, state=replace(state, reclaiming=None), evidence=ev, reason=spared
            )
        return NoAction(lease=lease.id, state=state, evidence=ev, reason=spared)
    if rec is not None:
        return _follow(lease, policy, case, ev, pressure, now, waiting)
    held_off = state.snooze_until is not None and now < state.snooze_until
    age_held = state.age_snooze_until is not None and now < state.age_snooze_until
    if (
        policy.max_age is not None
        and not age_held
        and now - lease.granted_at >= policy.max_age - policy.warn_before
    ):
        deadline = max(lease.granted_at + policy.max_age, now + policy.warn_before)
        why = f"the lease reaches its maximum age of {_h(policy.max_age)}"
        return _notice(lease, "max_age", deadline, why, policy.action, ev, now)
    never = float("-inf")
    if state.idle_since is not None:
        timeout = policy.pressure_idle_timeout if pressure else policy.idle_timeout
        due = max(
            state.idle_since + timeout,
            (never if state.last_busy is None else state.last_busy) + policy.busy_grace,
            never if state.snooze_until is None else state.snooze_until,
        )
        if now >= due - policy.warn_before and not held_off:
            why = f"the GPU has been idle for {_h(now - state.idle_since)}"
            why += " and others wait for this hardware" if pressure else ""
            deadline = max(due, now + policy.warn_before)
            return _notice(lease, "idle", deadline, why, policy.action, ev, now, pressure)
    if state.gpu_idle_since is not None:
        due = max(
            state.gpu_idle_since + policy.cpu_busy_timeout,
            never if state.snooze_until is None else state.snooze_until,
        )
        if now >= due - policy.warn_before and not held_off:
            why = f"the GPU has been idle for {_h(now - state.gpu_idle_since)} (kernel on the CPU)"
            deadline = max(due, now + policy.warn_before)
            return _notice(lease, "cpu", deadline, why, policy.action, ev, now)
    if case.verdict == "active":
        reason = f"active: {case.why}"
    elif case.verdict == "idle":
        reason = f"idle for {_h(ev.idle_for)}, counting"
    else:
        reason = f"GPU idle for {_h(ev.gpu_idle_for)} with the kernel on the CPU, counting"
    return NoAction(lease=lease.id, state=state, evidence=ev, reason=reason)


def _notice(
    lease: LeaseInfo,
    kind: str,
    deadline: float,
    reason: str,
    action: str,
    ev: Evidence | None,
    now: float,
    pressure: bool = False,
    for_request: str | None = None,
) -> Notice:
    rec = Reclaiming(kind, deadline, reason, action, now, pressure, for_request)
    return Notice(
        lease=lease.id, state=replace(lease.state, reclaiming=rec), evidence=ev, reclaiming=rec
    )


def _cancel_reason(case: Case) -> str:
    if case.gpu == "busy":
        return "the GPU got busy again"
    if case.presence == "present":
        return "the user is back"
    if case.kernel in ("busy", "unknown"):
        return "the kernel is running"
    return case.why


def enforced_release(kind: str) -> str:
    """The release reason of a lease whose enforced notice (admin, drain or exception) is
    carried out, whoever carries it out: an exception's approved time ``lapsed``, a spent
    budget (``budget_action: stop``) ``budget``; else ``admin``."""
    return {"exception": "lapsed", "budget": "budget"}.get(kind, "admin")


def _admin_follow(lease: LeaseInfo, now: float) -> Decision:
    """A lease under an admin's notice: act at its deadline (busy or not: the admin says so)."""
    rec = lease.state.reclaiming
    assert rec is not None
    if now >= rec.deadline:
        return Act(
            lease=lease.id,
            state=lease.state,
            action=rec.action,
            reason=rec.reason,
            release_reason=enforced_release(rec.kind),
        )
    left = f"{rec.action} in {_h(rec.deadline - now)} ({rec.kind} notice)"
    return NoAction(lease=lease.id, state=lease.state, reason=left, kind="noticed")


def _follow(
    lease: LeaseInfo,
    policy: ReclaimPolicy,
    case: Case,
    ev: Evidence,
    pressure: bool,
    now: float,
    waiting: set[str],
) -> Decision:
    """A lease under notice: cancel it, act at the deadline, or wait."""
    state = lease.state
    rec = state.reclaiming
    assert rec is not None
    cleared = replace(state, reclaiming=None)
    cancel: str | None = None
    release = "reclaimed-idle"
    if rec.kind == "borrowed":
        release = "reclaimed-borrowed"
        if rec.for_request not in waiting:
            cancel = "the request it was for is served or withdrawn"
        elif not lease.borrowed:
            cancel = "the lease is within its owner's guarantee now"
        elif _gpu_working(case) and not policy.reclaim_busy_borrowed:
            cancel = "the GPU got busy again"
    elif rec.kind == "max_age":
        release = "expired"
        if now >= rec.deadline and _gpu_working(case):
            why = "maximum age reached; waiting while the GPU is busy"
            return NoAction(lease=lease.id, state=state, evidence=ev, reason=why, kind="deferred")
    elif rec.kind == "idle":
        if case.verdict != "idle":
            cancel = _cancel_reason(case)
        elif (
            rec.pressure
            and not pressure
            and state.idle_since is not None
            and state.idle_since + policy.idle_timeout > rec.deadline
        ):
            cancel = "nobody waits for this hardware any more"
    elif case.verdict == "active":  # a cpu notice: the kernel working on the CPU is expected
        cancel = _cancel_reason(case)
    if cancel is not None:
        return Cancel(lease=lease.id, state=cleared, evidence=ev, reason=cancel)
    if now >= rec.deadline:
        return Act(
            lease=lease.id,
            state=state,
            evidence=ev,
            action=rec.action,
            reason=rec.reason,
            release_reason=release,
        )
    left = f"{rec.action} in {_h(rec.deadline - now)} unless the lease is used or kept"
    return NoAction(lease=lease.id, state=state, evidence=ev, reason=left, kind="noticed")


def _reclaim_borrowed(
    leases: Sequence[LeaseInfo],
    out: dict[str, Decision],
    cases: Mapping[str, Case],
    policies: PolicySet,
    waiting: Sequence[Waiter],
    quotas: QuotaBook,
    now: float,
    offers: Mapping[str, Offer],
    serves: ServesFn,
) -> None:
    """For each waiter within guarantee (in queue order), give notice to one borrowed lease
    that makes room, in ``borrowing.reclaim_order`` (the owner most over guarantee first, then
    the idlest, then the youngest);
    never one that would take anybody below guarantee, younger than ``min_runtime`` or busy on
    the GPU, and none when a lease already leaving makes the room."""
    by_id = {le.id: le for le in leases}
    held_user, held_group = dict(quotas.held_user), dict(quotas.held_group)
    spare: list[str] = []
    promised: set[str] = set()
    hopeless: set[tuple[str, Fraction]] = set()
    for lid, d in out.items():
        rec = d.state.reclaiming
        if rec is None:
            continue
        _take(by_id[lid], held_user, held_group)
        if rec.kind == "borrowed" and rec.for_request:
            promised.add(rec.for_request)
        else:
            spare.append(lid)
    for w in waiting:
        if w.request.id in promised or quotas.borrows(w.request.user, w.group, w.units):
            continue
        wanted = offers[w.request.offer]
        coming = next((lid for lid in spare if serves(by_id[lid], wanted, w.units, offers)), None)
        if coming is not None:
            spare.remove(coming)
            continue
        ask = (w.request.offer, w.units)
        if ask in hopeless:  # an identical ask found no lease this round; none has appeared
            continue
        best: tuple[tuple[Fraction, float, float, str], LeaseInfo, ReclaimPolicy] | None = None
        for le in leases:
            d, case = out[le.id], cases.get(le.id)
            if case is None or not le.borrowed or not isinstance(d, NoAction) or d.state.reclaiming:
                continue
            policy = policies.for_offer(offers.get(le.offer) or le.offer)
            if not policy.enabled or policy.exempts(le.user, le.groups):
                continue
            if now - le.granted_at < policy.min_runtime:
                continue
            if _gpu_working(case) and not policy.reclaim_busy_borrowed:
                continue
            if not serves(le, wanted, w.units, offers):
                continue
            surplus = _surplus(le, held_user, held_group, quotas)
            if surplus < le.units:  # taking it would go below someone's guarantee
                continue
            key = reclaim_order(surplus, d.state.gpu_idle_since, le.granted_at, le.id, now)
            if best is None or key < best[0]:
                best = (key, le, policy)
        if best is None:
            hopeless.add(ask)
            continue
        _, le, policy = best
        _take(le, held_user, held_group)
        promised.add(w.request.id)
        who, what = w.request.user, wanted.display_name or wanted.name  # users read names
        why = f"borrowed beyond guarantee; {who} (within guarantee) waits for {what}"
        observed = replace(le, state=out[le.id].state)
        ev = out[le.id].evidence
        out[le.id] = _notice(
            observed,
            "borrowed",
            now + policy.warn_before,
            why,
            policy.action,
            ev,
            now,
            True,
            w.request.id,
        )


def _take(
    lease: LeaseInfo, held_user: dict[str, Fraction], held_group: dict[str, Fraction]
) -> None:
    held_user[lease.user] = held_user.get(lease.user, Fraction(0)) - lease.units
    if lease.group is not None:
        held_group[lease.group] = held_group.get(lease.group, Fraction(0)) - lease.units


def _surplus(
    lease: LeaseInfo,
    held_user: Mapping[str, Fraction],
    held_group: Mapping[str, Fraction],
    quotas: QuotaBook,
) -> Fraction:
    """Units the owner holds beyond guarantee (``borrowing.owner_surplus``)."""
    return owner_surplus(lease.user, lease.group, held_user, held_group, quotas)


__all__ = [
    "CASES",
    "GPU_STATES",
    "KERNEL_STATES",
    "MIG_IDLE_MEMORY_MIB",
    "MIG_MEMORY_DELTA_MIB",
    "NOTICE_KINDS",
    "POLICY_FIELDS",
    "PRESENCE_STATES",
    "SHRINK_KINDS",
    "SIGNAL_SOURCES",
    "VERDICTS",
    "Act",
    "Cancel",
    "Case",
    "Decision",
    "Evidence",
    "Extend",
    "GpuSample",
    "KernelView",
    "LeaseInfo",
    "NoAction",
    "Notice",
    "PolicySet",
    "PresenceView",
    "ReclaimPolicy",
    "ReclaimState",
    "Reclaiming",
    "Refuse",
    "ServesFn",
    "Signals",
    "cases_markdown",
    "classify",
    "gpu_activity",
    "gpu_signal_source",
    "keepalive",
    "kernel_activity",
    "notice_words",
    "observe",
    "parse_duration",
    "parse_policies",
    "parse_policy",
    "plan_reclaims",
    "presence_of",
    "read_window",
    "serves",
    "share_samples",
    "share_signal_source",
    "shrink_problem",
    "stale_reason",
    "withdraw",
    "withdrawn_on_uncordon",
]
