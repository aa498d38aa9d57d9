"""Kernel leases: a kernel's request (its lease asked like a server's, class ``interactive``),
its release, its provisioner's reports and the kernel reaper's round (``pool.kernels``: a
kernel nobody reports is released, an idle one gets a notice, one whose notice ran out is
released)."""

from __future__ import annotations

from typing import Any

from .. import commands as c
from ..effects import (
    Effect,
    KeptAlive,
    KernelBusy,
    KernelNoticeCancelled,
    KernelNoticed,
    KernelRequested,
    LeaseActivated,
)
from ..ending import finishing
from ..errors import PoolError, Refusal
from ..facts import KernelFacts, LeaseFacts, Outcome, PoolState, Rule
from ..kernels import (
    check_kernel_id,
    check_kernel_state,
    idle_notice,
    kernel_server,
    kernel_verdict,
)
from ..leases import LIVE_STATES
from ..model import offer_priority
from ..workloads import INTERACTIVE, request_priority
from .jobs import refused
from .leases import allocate


def kernel_not_found(kernel_id: str) -> Refusal:
    """The refusal for a kernel lease that does not exist (or is not the caller's)."""
    return Refusal("not_found", f"no GPU kernel {kernel_id!r}", field="id")


def _the_kernel(state: PoolState, kernel_id: str) -> KernelFacts:
    if state.kernel is None:
        raise kernel_not_found(kernel_id)
    return state.kernel


def _request(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Ask for ``cmd.offer`` for the kernel: granted or queued like a server's lease (the same
    quota). A kernel that holds or waits for the same offer answers that lease (a restart
    keeps its GPU); another offer, or another user's kernel, is ``kernel_exists``."""
    try:
        check_kernel_id(cmd.kernel_id)
    except PoolError as e:
        raise Refusal(e.code, e.message, field=e.field) from None
    if state.kernel is not None:
        live = state.kernel.lease
        if live.user != cmd.user or live.offer != cmd.offer:
            raise Refusal(
                "kernel_exists",
                f"kernel {cmd.kernel_id} already holds a lease for {live.offer!r}",
                field="kernel_id",
            )
        return Outcome(live.id)
    cls = state.classes[INTERACTIVE]
    prio = request_priority(state.classes, cls, offer_priority(state.alloc.offers.get(cmd.offer)))
    ask = c.Allocate(
        cmd.user, kernel_server(cmd.kernel_id), cmd.offer, group=cmd.group, groups=cmd.groups,
        priority=prio, actor=cmd.actor,
    )  # fmt: skip
    asked = allocate(state, ask, now)
    return Outcome(asked.answer, (*asked.effects, KernelRequested(asked.answer, cls.name)))


def _release(state: PoolState, cmd: Any, now: float) -> Outcome:
    """End the kernel's lease (shut down, restarted with another offer, cancelled while
    queued); an ended one stays as it is."""
    facts = _the_kernel(state, cmd.kernel_id).lease
    if facts.state == "released":
        return Outcome(facts.id)
    why = "cancelled" if facts.state == "queued" else "stopped"
    return Outcome(facts.id, finishing(state, [(facts, why)], now))


def _activity(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The provisioner's report (its heartbeat): alive and ``busy`` (executing: its idle
    notice, if any, is called off), ``idle`` or ``starting``. The first report of a granted
    kernel binds its lease. A released lease is answered as it is (the provisioner shuts
    the kernel down)."""
    try:
        check_kernel_state(cmd.state)
    except PoolError as e:
        raise refused(e) from None
    kernel = _the_kernel(state, cmd.kernel_id)
    facts, lid = kernel.lease, kernel.lease.id
    if facts.state == "released":
        return Outcome(lid)
    effects: list[Effect] = [KeptAlive(lid)]
    after = facts.state
    if facts.state == "granted":
        effects.append(LeaseActivated(lid))
        after = "active"
    if cmd.state == "busy" and after in LIVE_STATES:
        effects.append(KernelBusy(lid))
        if kernel.notice_deadline is not None and facts.reclaim_kind is None:
            effects.append(KernelNoticeCancelled(lid))
    return Outcome(lid, tuple(effects))


def _reap(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The kernel reaper's round (``kernels.kernel_verdict``): release the leases of kernels
    nobody reports any more (``orphaned``), give idle ones their notice, release those whose
    notice ran out (``idle``). Answers the lease ids acted on, in the leases' order."""
    rules = state.kernel_rules
    acted: list[str] = []
    notices: list[Effect] = []
    ending: list[tuple[LeaseFacts, str]] = []
    for kernel in state.kernels:
        lid = kernel.lease.id
        verdict = kernel_verdict(
            now, kernel.last_report, kernel.last_busy, kernel.notice_deadline, rules
        )
        if verdict == "lost":
            ending.append((state.leases[lid], "orphaned"))
        elif verdict == "reclaim":
            ending.append((state.leases[lid], "idle"))
        elif verdict == "notice":
            why = idle_notice(now - kernel.last_busy, rules.notice)
            notices.append(KernelNoticed(lid, now + rules.notice, why))
        else:
            continue
        acted.append(lid)
    ended = finishing(state, ending, now) if ending else ()
    return Outcome(acted, (*notices, *ended))


RULES: dict[type[c.Command], Rule] = {
    c.RequestKernel: _request,
    c.ReleaseKernel: _release,
    c.KernelActivity: _activity,
    c.ReapKernels: _reap,
}
