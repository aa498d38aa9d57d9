"""Dynamic MIG: what a node did with its plan (``MigResults``); and re-partitions, an
administrator's new layout for a GPU (``RequestRepartition``), given up while it waits
(``CancelRepartition``), run once nothing is in the way and closed when the node has it
(``AdvanceRepartitions``), or failed as mig-manager says (``FailRepartition``). The plans are
``pool.migplan``'s and ``pool.repartition``'s; the allocator follows through effects (a GPU's
cordon, its layout as the rows now say), never a rebuild."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...timeparse import format_epoch
from .. import commands as c
from ..dramig import NO_REPARTITION
from ..effects import (
    Effect,
    GpuCordoned,
    LeaseGranted,
    LeaseNoted,
    MigCreated,
    MigDestroyed,
    MigFailed,
    MigRowsSet,
    RepartitionApplying,
    RepartitionClosed,
    RepartitionOpened,
    WaitReason,
)
from ..ending import finish_in, notices_in
from ..errors import Refusal
from ..facts import LeaseFacts, MigGpu, Outcome, PoolState, Repartition, Rule
from ..leases import LIVE_STATES
from ..migplan import GpuLayout, Seen, Wanted, mig_key, plan_gpu, with_retiring
from ..model import RETIRING, MigInstance
from ..reclaim import Reclaiming
from ..repartition import parse_layout, plan_repartition
from ..trial import Trial
from .notices import MAX_GRACE

#: States of a re-partition still open.
OPEN = ("waiting", "applying")


def _request(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Ask for ``cmd.layout`` on a GPU (``state.mig_gpu``): it is cordoned and waits until
    nothing holds what must go; with ``cmd.notice_seconds``, the leases in the way
    (``state.on_node``) get an administrator's notice ending then (a grant not yet bound is
    released now). It runs at once if nothing is in the way (then). Answers the plan."""
    target = parse_layout(cmd.layout)
    seconds = cmd.notice_seconds
    if seconds is not None and not 0 <= seconds <= MAX_GRACE:
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
            by = format_epoch(deadline)
            why = f"an administrator re-partitions this GPU's MIG layout by {by}"
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
        observed = {mig_key(o) for o in g.observed or ()}
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
    held = _holders(state, g.uuid)
    out = [
        MigInstance(p, s, rows.get((p, s)), held.get((p, s)) if (p, s) in rows else None)
        for p, s in target
    ]
    if g.dynamic and g.observed:
        out = with_retiring(g.model, out, [(*mig_key(o), o.get("uuid")) for o in g.observed])
    return tuple(out)


def _holders(state: PoolState, gpu: str) -> dict[tuple[str, int], str | None]:
    """Who holds each MIG instance of ``gpu`` in the allocator (a lease, an outside mark),
    by (profile, start); an instance retiring holds nothing it keeps."""
    found = state.alloc.gpus.get(gpu)
    instances = found.instances if found is not None else []
    return {(i.profile, i.start): i.lease for i in instances if i.lease != RETIRING}


def _close(rep: Repartition, g: MigGpu | None, to: str, error: str | None) -> RepartitionClosed:
    """``rep`` ends in state ``to``: its GPU (if any) gets back the cordon it had."""
    return RepartitionClosed(rep.id, rep.gpu, to, error, None if g is None else rep.was_cordoned)


# -- what a node did with its plan ----------------------------------------------------------

#: ``error`` of a creation the pool gives up on before asking the node: an instance the pool
#: did not plan, with processes on it, holds its memory slices.
OCCUPIED = "Occupied"


@dataclass
class _Gpu:
    """One GPU's instance rows and reported entries as a node's results change them."""

    facts: MigGpu
    rows: dict[tuple[str, int], list[Any]]  # (profile, start) → [uuid, attempts, error]
    observed: list[Mapping[str, Any]] | None


class _Results:
    """``MigResults`` worked through: the effects in order, the leases given up on."""

    def __init__(self, state: PoolState, node: str) -> None:
        self.state, self.node = state, node
        self.effects: list[Effect] = []
        self.gpus: dict[str, _Gpu] = {}
        self.given_up: list[tuple[LeaseFacts, str]] = []
        self.freed = False

    def gpu(self, g: MigGpu) -> _Gpu:
        if g.uuid not in self.gpus:
            rows = {(p, s): [uuid, n, error] for p, s, uuid, n, error in g.instances}
            observed = None if g.observed is None else list(g.observed)
            self.gpus[g.uuid] = _Gpu(g, rows, observed)
        return self.gpus[g.uuid]

    def creation(self, w: _Gpu, key: tuple[str, int], r: Mapping[str, Any]) -> None:
        g, row = w.facts, w.rows.get(key)
        holder = self.state.mig_holders.get((g.uuid, *key))
        if r["ok"]:
            seen = {"profile": key[0], "start": key[1], "uuid": r.get("mig_uuid")}
            w.observed = [o for o in w.observed or () if mig_key(o) != key] + [
                {**seen, "processes": 0, "attempts": 0}
            ]
            if row is not None and (row[0] is None or row[0] != r.get("mig_uuid")):
                row[:] = [r.get("mig_uuid"), 0, None]
                lid, renew = (holder[0], holder[1] == "granted") if holder else (None, False)
                made = MigCreated(self.node, g.uuid, *key, r.get("mig_uuid"), lid, renew)
                self.effects.append(made)
            return
        error = r.get("error")
        if row is None:  # nothing wanted there any more
            self.effects.append(MigFailed(self.node, g.uuid, "create", *key, error))
            return
        row[1] += 1
        row[2] = str(error or "Unknown")[:64]
        lid = holder[0] if holder else None
        message = None
        if lid is not None:
            message = (
                f"Creating the MIG {key[0]} instance on node {self.node} failed: {row[2]} "
                f"(attempt {row[1]} of {self.state.mig_attempts})"
            )
        failed = MigFailed(self.node, g.uuid, "create", *key, error, row[1], lid, message)
        self.effects.append(failed)
        if row[1] >= self.state.mig_attempts:
            self.give_up(w, key, lid)

    def destruction(self, w: _Gpu, key: tuple[str, int], r: Mapping[str, Any]) -> None:
        error, g = r.get("error"), w.facts
        if r["ok"] or error == "NotFound":
            w.observed = [o for o in w.observed or () if mig_key(o) != key]
            self.effects.append(MigDestroyed(self.node, g.uuid, *key, error))
            self.freed = True
            return
        observed, attempt = [], None
        for o in w.observed or ():
            if mig_key(o) == key:
                if error == "InUse":  # a process started: not before the node says it ended
                    o = {**o, "processes": max(1, o.get("processes") or 0)}
                else:
                    o = {**o, "attempts": o.get("attempts", 0) + 1}
                    attempt = o["attempts"]
            observed.append(o)
        w.observed = observed
        self.effects.append(MigFailed(self.node, g.uuid, "destroy", *key, error, attempt))

    def blocked(self, w: _Gpu) -> None:
        """Give up at once on wanted instances a busy unwanted one makes impossible (never on
        the DRA driver's GPUs: a claim, not the agent, makes the instance)."""
        g = w.facts
        if not (g.dynamic and g.mig_enabled) or w.observed is None or g.by_claim:
            return
        layout = GpuLayout(
            g.uuid,
            g.model,
            tuple(Wanted(p, s, row[1]) for (p, s), row in w.rows.items()),
            tuple(
                Seen(*mig_key(o), o.get("uuid"), o.get("processes"), o.get("attempts", 0))
                for o in w.observed
            ),
        )
        for want in plan_gpu(layout, self.state.mig_attempts).blocked:
            key = (want.profile, want.start)
            w.rows[key][2] = OCCUPIED
            holder = self.state.mig_holders.get((g.uuid, *key))
            lid = holder[0] if holder else None
            failed = MigFailed(self.node, g.uuid, "create", *key, OCCUPIED, None, lid, None, True)
            self.effects.append(failed)
            self.give_up(w, key, lid)

    def give_up(self, w: _Gpu, key: tuple[str, int], lid: str | None) -> None:
        """Stop trying to create ``key``: its grant is released (``mig-failed``), else the
        pool just stops wanting it."""
        facts = self.state.leases.get(lid) if lid is not None else None
        ended = {f.id for f, _ in self.given_up}
        if facts is None or facts.state not in LIVE_STATES or facts.id in ended:
            del w.rows[key]
            return
        message = (
            f"The node {self.node} could not create the MIG {key[0]} instance "
            f"({w.rows[key][2]}); the grant was released: ask again"
        )
        self.effects.append(LeaseNoted(facts.id, message))
        self.given_up.append((facts, "mig-failed"))

    def layout(self, w: _Gpu) -> MigRowsSet:
        """The GPU's rows after the results, and its instances for the allocator (the
        holders stay on the instances they hold)."""
        g = w.facts
        rows = tuple((p, s, row[0], row[1], row[2]) for (p, s), row in w.rows.items())
        held = _holders(self.state, g.uuid)
        instances = [MigInstance(p, s, uuid, held.get((p, s))) for p, s, uuid, _, _ in rows]
        if g.dynamic and w.observed:
            seen = [(*mig_key(o), o.get("uuid")) for o in w.observed]
            instances = with_retiring(g.model, instances, seen)
        observed = None if w.observed is None else tuple(w.observed)
        return MigRowsSet(g.uuid, rows, observed, tuple(instances))


def blocked_creations(
    state: PoolState,
    node: str,
    gpus: Iterable[tuple[MigGpu, dict[tuple[str, int], list[Any]], list[Mapping[str, Any]] | None]],
) -> tuple[list[Effect], list[tuple[LeaseFacts, str]]]:
    """``MigResults``' rule for the wanted instances a busy unwanted one makes impossible, on
    GPUs whose rows an inventory just set ((the GPU, its rows by (profile, start) as
    [uuid, failed creations, error], changed in place, what the node reported)): the
    effects (``MigFailed``, what the leases are told) and the leases given up on
    (``mig-failed``; the holders are ``state.mig_holders``, their facts ``state.leases``)."""
    work = _Results(state, node)
    for g, rows, observed in gpus:
        work.blocked(_Gpu(g, rows, observed))
    return work.effects, work.given_up


def _mig_results(state: PoolState, cmd: Any, now: float) -> Outcome:
    """What a node's agent did with its plan (one result per action it applied). A creation
    that worked makes its lease ready; one that failed is audited, told to the lease and
    retried up to ``state.mig_attempts`` times, then its grant is released. A destruction that
    worked (or found nothing) frees the memory slices, and the queue is served. ``InUse``
    (processes appeared) is no failure: it waits for the next inventory. The GPUs' layouts
    follow in the allocator (``MigRowsSet``). Answers how many results were taken."""
    if state.mig_node is None:
        raise Refusal("not_found", f"no node {cmd.node!r}", field="name")
    gpus = {g.uuid: g for g in state.mig_node}
    results = list(cmd.results)
    for i, r in enumerate(results):
        if r["gpu"] not in gpus:
            raise Refusal(
                "invalid_field",
                f"results[{i}].gpu: not a GPU of node {cmd.node}",
                field=f"results[{i}].gpu",
            )
    work = _Results(state, cmd.node)
    for r in results:
        w = work.gpu(gpus[r["gpu"]])
        if r["op"] == "create":
            work.creation(w, mig_key(r), r)
        else:
            work.destruction(w, mig_key(r), r)
    for w in list(work.gpus.values()):
        work.blocked(w)
    effects = work.effects
    layouts = [work.layout(w) for w in work.gpus.values()]
    effects += layouts
    with Trial(state.alloc) as trial:
        for layout in layouts:
            if layout.gpu in state.alloc.gpus:
                trial.set_instances(layout.gpu, [replace(i) for i in layout.instances])
        finish_in(trial, work.given_up, now, effects)
        if work.freed:
            effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome({"accepted": len(results)}, tuple(effects))


RULES: dict[type[c.Command], Rule] = {
    c.MigResults: _mig_results,
    c.RequestRepartition: _request,
    c.CancelRepartition: _cancel,
    c.AdvanceRepartitions: _advance_all,
    c.FailRepartition: _fail,
}
