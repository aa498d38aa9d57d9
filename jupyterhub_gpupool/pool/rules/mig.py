"""MIG re-partitions: an administrator's new layout for a GPU (``RequestRepartition``), given
up while it waits (``CancelRepartition``), run once nothing is in the way and closed when the
node has it (``AdvanceRepartitions``), or failed as mig-manager says (``FailRepartition``).
The plans are ``pool.repartition``'s; the allocator follows through effects (the GPU's cordon,
its layout once written), never a rebuild."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from .. import commands as c
from ..dramig import NO_REPARTITION
from ..effects import (
    Effect,
    GpuCordoned,
    RepartitionApplying,
    RepartitionClosed,
    RepartitionOpened,
    WaitReason,
)
from ..ending import notices_in
from ..errors import Refusal
from ..facts import MigGpu, Outcome, PoolState, Repartition, Rule
from ..leases import LIVE_STATES
from ..migplan import with_retiring
from ..model import RETIRING, MigInstance
from ..reclaim import Reclaiming
from ..repartition import parse_layout, plan_repartition
from ..trial import Trial

#: The longest notice an administrator may give (a year, as for policies).
MAX_NOTICE = 366 * 86400.0
#: States of a re-partition still open.
OPEN = ("waiting", "applying")


def _request(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Ask for ``cmd.layout`` on a GPU (``state.mig_gpu``): it is cordoned and waits until
    nothing holds what must go; with ``cmd.notice_seconds``, the leases in the way
    (``state.on_node``) get an administrator's notice ending then (a grant not yet bound is
    released now). It runs at once if nothing is in the way (then). Answers the plan."""
    target = parse_layout(cmd.layout)
    seconds = cmd.notice_seconds
    if seconds is not None and not 0 <= seconds <= MAX_NOTICE:
        raise Refusal("invalid_field", "must be 0 to 366 days in seconds", field="notice_seconds")
    g = state.mig_gpu
    if g is None:
        raise Refusal("not_found", f"no GPU {cmd.gpu!r} on node {cmd.node!r}", field="gpu")
    if g.by_claim:  # the driver's node: mig-parted must not run there, on any of its GPUs
        raise Refusal("conflict", NO_REPARTITION.format(gpu=cmd.gpu, node=cmd.node), field="gpu")
    plan = plan_repartition(g.uuid, g.model, g.mig_enabled, g.held, target)
    rep = state.open_repartition
    if rep is not None:
        raise Refusal(
            "repartition_pending",
            f"GPU {g.uuid} has a re-partition in progress (#{rep.id}, {rep.state})",
            field="gpu",
        )
    layout = tuple(plan.target)
    effects: list[Effect] = [
        RepartitionOpened(g.node, g.uuid, layout, g.method, g.cordoned, plan.to_json()),
        GpuCordoned(g.uuid, True),
    ]
    with Trial(state.alloc) as trial:
        trial.set_gpu_cordon(g.uuid, True)
        if seconds is not None:
            deadline = now + seconds
            why = f"an administrator re-partitions this GPU's MIG layout by {_iso(deadline)}"
            notice = Reclaiming("admin", deadline, why, "stop", now)
            in_way = {h.lease for h in plan.in_way if h.lease}
            given = sorted(
                (
                    (facts, rs)
                    for facts, rs in state.on_node
                    if facts.id in in_way and facts.state in LIVE_STATES
                ),
                key=lambda given: given[0].id,
            )
            notices_in(trial, given, notice, now, effects)
            effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
        held = tuple(replace(h, lease=None) if h.lease in trial.ended else h for h in g.held)
        opened = Repartition(0, g.node, g.uuid, layout, g.method, "waiting", g.cordoned)
        effects += _advance(state, opened, replace(g, cordoned=True, held=held))
    return Outcome(plan.to_json(), tuple(effects))


def _cancel(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Give up a re-partition still waiting (one being applied is the node's now): its GPU
    gets back the cordon it had."""
    rep, g = _the_repartition(state, cmd.rep_id)
    if rep.state != "waiting":
        raise Refusal(
            "repartition_applying",
            f"re-partition {rep.id} is {rep.state}: it can no longer be cancelled",
            field="id",
        )
    if g is None:
        raise Refusal("not_found", f"no GPU {rep.gpu!r} on node {rep.node!r}", field="gpu")
    return Outcome(rep.id, (_close(rep, g, "cancelled", None),))


def _advance_all(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Run the waiting re-partitions nothing is in the way of any more, and close those the
    nodes finished (or failed; a GPU gone fails its re-partition). Answers how many changed."""
    effects: list[Effect] = []
    for rep, g in state.repartitions:
        if rep.state not in OPEN:
            continue
        if g is None:
            effects.append(_close(rep, None, "failed", "the GPU is gone"))
        else:
            effects += _advance(state, rep, g)
    changed = sum(isinstance(e, (RepartitionApplying, RepartitionClosed)) for e in effects)
    return Outcome(changed, tuple(effects))


def _fail(state: PoolState, cmd: Any, now: float) -> Outcome:
    """mig-manager failed a re-partition ``applying`` through the node's label: it closes as
    ``failed`` with its message (one already closed is left as it is: the writer may report
    twice)."""
    rep, g = _the_repartition(state, cmd.rep_id)
    if rep.state != "applying" or rep.method != "label":
        return Outcome(rep.id)
    return Outcome(rep.id, (_close(rep, g, "failed", cmd.error[:2000]),))


def _the_repartition(state: PoolState, rep_id: int) -> tuple[Repartition, MigGpu | None]:
    for rep, g in state.repartitions:
        if rep.id == rep_id:
            return rep, g
    raise Refusal("not_found", f"no re-partition {rep_id}", field="id")


def _advance(state: PoolState, rep: Repartition, g: MigGpu) -> list[Effect]:
    """A waiting re-partition runs once nothing is in the way (the agent's GPU gets the layout
    written); an applying one closes once the node has the layout, or fails when it could not
    make it."""
    target = list(rep.layout)
    if rep.state == "waiting":
        if not plan_repartition(g.uuid, g.model, g.mig_enabled, g.held, target).ready:
            return []
        instances = _written(state, g, target) if rep.method == "agent" else None
        return [RepartitionApplying(rep.id, g.uuid, rep.layout, instances)]
    have = {(p, s): (uuid, attempts, error) for p, s, uuid, attempts, error in g.instances}
    if rep.method == "agent":
        missing = [key for key in target if key not in have]
        failed = [k for k, (_, n, error) in have.items() if error and n >= state.mig_attempts]
        if missing or failed:
            why = "the node could not create " + ", ".join(f"{p}@{s}" for p, s in missing or failed)
            return [_close(rep, g, "failed", why)]
        observed = {(p, s) for p, s, _ in g.observed or ()}
        if observed == set(target) and all(have[k][0] for k in target):
            return [_close(rep, g, "done", None)]
    elif g.mig_enabled and set(have) == set(target):
        return [_close(rep, g, "done", None)]
    return []


def _written(state: PoolState, g: MigGpu, target: list[tuple[str, int]]) -> tuple[MigInstance, ...]:
    """The GPU's instances for the allocator once ``target`` is its layout: the instances kept
    as they are (with their uuid and holder), the new ones planned, and what the node still
    has that is no longer wanted held by ``RETIRING``."""
    rows = {(p, s): uuid for p, s, uuid, _, _ in g.instances}
    held = {
        (i.profile, i.start): i.lease
        for i in state.alloc.gpus[g.uuid].instances
        if i.lease != RETIRING
    }
    out = [
        MigInstance(p, s, rows.get((p, s)), held.get((p, s)) if (p, s) in rows else None)
        for p, s in target
    ]
    if g.dynamic and g.observed:
        out = with_retiring(g.model, out, g.observed)
    return tuple(out)


def _close(rep: Repartition, g: MigGpu | None, to: str, error: str | None) -> RepartitionClosed:
    """``rep`` ends in state ``to``: its GPU (if any) gets back the cordon it had."""
    return RepartitionClosed(rep.id, rep.gpu, to, error, None if g is None else rep.was_cordoned)


def _iso(epoch: float) -> str:
    """Epoch seconds as the API writes times (ISO 8601, UTC, with a ``Z``)."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


RULES: dict[type[c.Command], Rule] = {
    c.RequestRepartition: _request,
    c.CancelRepartition: _cancel,
    c.AdvanceRepartitions: _advance_all,
    c.FailRepartition: _fail,
}
