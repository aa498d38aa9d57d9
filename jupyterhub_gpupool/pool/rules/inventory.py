"""What the cluster says about a node's devices: its agent's inventory (``PutInventory``),
held outside the pool (``SetOutside``), and the devices a lease's server really got
(``Rebind``); the outside rules are ``pool.outside``'s.

An inventory adds or updates a node; the allocator puts the node as the rows now say in
place of its own (``pool.nodeput``), never a rebuild. A lease on a GPU that vanished or
switched its MIG mode, or on an instance that vanished, holds something that is gone: it ends
``node-lost`` first. A dynamic GPU's report only says which wanted instances exist (a grant's
instance made is ready; one that vanished under its grant is planned again); a static one's is
its layout. A wanted instance a busy unwanted one blocks is given up at once, by
``MigResults``' rule (``rules.mig.blocked_creations``). The queue is served with what the
node has now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from .. import commands as c
from ..dramig import made_by_claim
from ..effects import (
    Effect,
    InventoryTaken,
    LeaseGranted,
    MigCreated,
    NodeReachable,
    NodeReported,
    OutsideSet,
    Rebound,
    WaitReason,
)
from ..ending import finish_in
from ..errors import Refusal
from ..facts import MigGpu, NodeRows, Outcome, PoolState, Rule
from ..leases import LIVE_STATES
from ..migplan import mig_key, with_retiring
from ..model import Gpu, MigInstance, Node, validate_node
from ..outside import mark_exact, place_outside, rebind
from ..sharing import reported_mode
from ..trial import Trial
from .mig import blocked_creations

#: A GPU's MIG instance rows by (profile, start): [uuid, failed creations, the last error].
_Rows = dict[tuple[str, int], list[Any]]


def _put_inventory(state: PoolState, cmd: Any, now: float) -> Outcome:
    """An agent's report of ``cmd.node`` over its rows (``state.node_rows``; None: a new
    node). Refused: a cluster the pool does not know (``unknown_cluster``), an invalid node
    (``pool.model.validate_node``), a GPU of another node (``gpu_elsewhere``)."""
    node: Node = cmd.node
    known = state.clusters
    if node.cluster not in known:
        raise Refusal(
            "unknown_cluster",
            f"unknown cluster {node.cluster!r}: the pool knows {', '.join(known)}",
            field="cluster",
            allowed=known,
        )
    validate_node(node)
    for gpu in node.gpus:
        other = state.elsewhere.get(gpu.uuid)
        if other is not None:
            raise Refusal("gpu_elsewhere", f"GPU {gpu.uuid} belongs to node {other}", field="uuid")
    rows = state.node_rows or NodeRows()
    before = {g.uuid: g for g in rows.gpus}
    reported = {g.uuid for g in node.gpus}
    vanished = [lid for g in rows.gpus if g.uuid not in reported for lid in rows.leases[g.uuid]]
    lost: dict[str, None] = {}  # the leases that end node-lost, in order
    ended = set(vanished)
    gpus: list[tuple[Gpu, MigGpu | None, _Rows, list[Mapping[str, Any]] | None]] = []
    made: list[Effect] = []
    for gpu in node.gpus:
        was = before.get(gpu.uuid)
        gpu = _as_written(node, gpu, was, rows, state.dra)
        if was is not None and was.mig_enabled != gpu.mig_enabled:  # what they hold is gone
            for lid in rows.leases[gpu.uuid]:
                lost[lid] = None
                ended.add(lid)
        held = {
            (p, s): (lid, st, create)
            for (u, p, s), (lid, st, create) in rows.slots.items()
            if u == gpu.uuid and lid not in ended and was is not None
        }
        synced, observed, gone = _synced(node.name, gpu, was, held, made)
        for lid in gone:
            lost[lid] = None
            ended.add(lid)
        gpus.append((gpu, was, synced, observed))
    lost.update(dict.fromkeys(vanished))
    for gpu, _, synced, _ in gpus:
        _drop_made_for(synced, gpu.uuid, rows, ended)
    holders = {k: (lid, st) for k, (lid, st, _) in rows.slots.items() if lid not in ended}
    on_rows = [
        (_mig_gpu(was, g), synced, observed) for g, was, synced, observed in gpus if was is not None
    ]
    holders = {k: (lid, st) for k, (lid, st, _) in rows.slots.items() if lid not in ended}
    state_now = replace(state, mig_holders=holders)
    blocked, given_up = blocked_creations(state_now, node.name, on_rows)
    for gpu, _, synced, _ in gpus:
        _drop_made_for(synced, gpu.uuid, rows, {f.id for f, _ in given_up})
    written = sorted(gpus, key=lambda w: w[0].index)
    put = Node(
        node.name,
        node.cluster,
        node.cpu_milli,
        node.memory_mib,
        [replace(g, instances=_instances(g, synced, obs)) for g, _, synced, obs in written],
        rows.cordoned,
        rows.draining,
        dict(node.labels),
    )
    reported_rows = NodeReported(
        put,
        tuple(_row_values(synced) for _, _, synced, _ in written),
        tuple(None if obs is None else tuple(obs) for _, _, _, obs in written),
        state.outside,
    )
    effects: list[Effect] = []
    back = state.node_rows is not None and rows.unreachable
    with Trial(state.alloc) as trial:
        if back:
            effects.append(NodeReachable(node.name, True))
            if node.name in state.alloc.nodes:
                trial.set_reachable(node.name, True)
        trial.serving = False  # not on the devices that go: once the node is put
        finish_in(trial, [(state.leases[lid], "node-lost") for lid in lost], now, effects)
        trial.serving = True
        trial.put_node(put, state.outside)
        effects += [reported_rows, *made, *blocked]
        finish_in(trial, given_up, now, effects)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    effects.append(InventoryTaken(node.name, len(node.gpus), cmd.actor))
    return Outcome(node.name, tuple(effects))


def _as_written(
    node: Node, gpu: Gpu, was: MigGpu | None, rows: NodeRows, dra: frozenset[str]
) -> Gpu:
    """A reported GPU as its row will say: the DRA driver's MIG is dynamic whatever the agent
    says; an agent's sharing ``auto`` keeps the mode known; the re-partition's cordon stays."""
    claim = made_by_claim(node.name, node.cluster, gpu.mig_enabled, dra)
    return replace(
        gpu,
        node=node.name,
        dynamic_mig=gpu.dynamic_mig or claim,
        mig_by_claim=claim,
        sharing=reported_mode(gpu.sharing, rows.sharing.get(gpu.uuid)),
        cordoned=was.cordoned if was is not None else False,
    )


def _synced(
    node: str,
    gpu: Gpu,
    was: MigGpu | None,
    held: Mapping[tuple[str, int], tuple[str, str, bool]],
    made: list[Effect],
) -> tuple[_Rows, list[Mapping[str, Any]] | None, list[str]]:
    """A GPU's instance rows after its report, what the node reported, and the leases whose
    instance vanished (``held``: the live leases on its instances; ``made`` gets the
    ``MigCreated`` of a grant's instance the node made).

    Dynamic MIG: the rows are the layout and the report only says which exist, so an
    instance the pool planned away is never taken back in; an instance that vanished under
    its lease loses it, except a grant's own, which is planned again. Static MIG: the report
    is the layout, and an instance made for a lease and not yet there stays."""
    reported = {(i.profile, i.start): i for i in gpu.instances}
    observed = None
    if gpu.mig_enabled:
        observed = _observed(was.observed if was is not None else None, reported.values())
    rows: _Rows = {
        (p, s): [uuid, n, error] for p, s, uuid, n, error in (was.instances if was else ())
    }
    keep: _Rows = {}
    gone: list[str] = []
    if gpu.mig_enabled and gpu.dynamic_mig:
        for key, row in rows.items():
            inst, h = reported.get(key), held.get(key)
            if inst is not None:
                if inst.uuid is not None and row[0] != inst.uuid:
                    if h is not None and row[0] is None:  # a grant's instance is made
                        renew = h[1] == "granted"
                        made.append(MigCreated(node, gpu.uuid, *key, inst.uuid, h[0], renew))
                    row[:] = [inst.uuid, 0, None]
            elif row[0] is not None:  # it existed and is gone
                row[0] = None
                if h is not None and not (h[2] and h[1] == "granted"):
                    gone.append(h[0])
                    continue
            keep[key] = row
        return keep, observed, gone
    for key, inst in reported.items():
        row = rows.pop(key) if key in rows else [None, 0, None]
        row[0] = inst.uuid or row[0]
        keep[key] = row
    for key, row in rows.items():
        h = held.get(key)
        if h is None:
            continue
        if h[2] and row[0] is None:
            keep[key] = row  # not made yet
        else:  # a held instance vanished
            gone.append(h[0])
    return keep, observed, gone


def _set_outside(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Pods the pool did not place hold ``cmd.counts`` devices of the node: mark that many
    (``place_outside``, the marks now ``state.outside`` first), or with ``cmd.devices`` (DRA)
    exactly those (``mark_exact``). When marks go away, the queue is served with what they
    free. Answers the marks (``OutsideHolds.to_json``)."""
    node = state.alloc.nodes.get(cmd.node)
    if not state.node_known or node is None:
        raise Refusal("not_found", f"no node {cmd.node!r}", field="node")
    before = state.outside
    if cmd.devices is None:
        after = place_outside(node, cmd.counts, before, cmd.pods)
    else:
        after = mark_exact(node, cmd.devices)
    if after == before:
        return Outcome(after.to_json())
    effects: list[Effect] = [OutsideSet(cmd.node, after)]
    if len(after.gpus) + len(after.instances) < len(before.gpus) + len(before.instances):
        with Trial(state.alloc) as trial:  # a device came back: whoever waits may have it
            trial.set_outside(cmd.node, after)
            effects += [LeaseGranted(g) for g in trial.promote(now)]
            effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(after.to_json(), tuple(effects))


def _rebind(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The lease's server runs on ``cmd.devices`` of its node, not on what the pool chose
    (``pool.outside.rebind``; the lease's row is ``state.leases[cmd.lease_id]``, the node's
    marks ``state.outside``): the lease holds those from now on, and what held them takes
    what it leaves. Saying what it has already changes nothing. Answers whether it moved."""
    facts = state.leases[cmd.lease_id]
    lease = state.alloc.leases.get(cmd.lease_id)
    if facts.state not in LIVE_STATES or lease is None:
        raise Refusal("not_live", f"lease {cmd.lease_id} is {facts.state}", field="id")
    if not lease.slots:
        raise Refusal("device_mismatch", f"lease {cmd.lease_id} holds no GPU", field="device")
    node = state.alloc.nodes[lease.node]
    held = {
        other.id: other.slots
        for other in state.alloc.leases.values()
        if other.node == node.name and other.id != cmd.lease_id
    }
    result = rebind(
        cmd.lease_id, lease.slots, cmd.devices, node, held, state.outside, cmd.exclusive
    )
    if not result.changed:
        return Outcome(False)
    before = tuple((lid, tuple(s.key for s in held[lid])) for lid in sorted(result.others))
    moved = Rebound(cmd.lease_id, node.name, tuple(cmd.devices), result, before)
    return Outcome(True, (moved,))


def _drop_made_for(synced: _Rows, gpu: str, rows: NodeRows, ended: Iterable[str]) -> None:
    """An instance the pool made for a lease that ends goes with it (its start, as the
    applier's release has it)."""
    ended = set(ended)
    starts = {
        s
        for (u, _, s), (lid, _, create) in rows.slots.items()
        if u == gpu and create and lid in ended
    }
    for key in [k for k in synced if k[1] in starts]:
        del synced[key]


def _instances(
    gpu: Gpu, synced: _Rows, observed: list[Mapping[str, Any]] | None
) -> list[MigInstance]:
    """The GPU's instances for the allocator, as a rebuild from its rows gives them
    (``store.rebuild.instances_of``): the rows by start, and on a dynamic GPU what the node
    still has that is no longer wanted held by ``RETIRING``."""
    out = [MigInstance(p, s, row[0]) for (p, s), row in sorted(synced.items(), key=_start)]
    if gpu.dynamic_mig and observed:
        out = with_retiring(gpu.model, out, [(*mig_key(o), o.get("uuid")) for o in observed])
    return out


def _mig_gpu(was: MigGpu, gpu: Gpu) -> MigGpu:
    """A GPU's row as the MIG rules read it once its report is written."""
    return replace(
        was,
        model=gpu.model,
        mig_enabled=gpu.mig_enabled,
        dynamic=gpu.dynamic_mig,
        by_claim=gpu.mig_by_claim,
    )


def _row_values(synced: _Rows) -> tuple[tuple[str, int, str | None, int, str | None], ...]:
    """A GPU's instance rows as ``NodeReported`` carries them, by start."""
    return tuple(
        (p, s, row[0], row[1], row[2]) for (p, s), row in sorted(synced.items(), key=_start)
    )


def _start(item: tuple[tuple[str, int], Any]) -> int:
    return item[0][1]


def _observed(
    before: Iterable[Mapping[str, Any]] | None, instances: Iterable[MigInstance]
) -> list[Mapping[str, Any]]:
    """A node's reported instances as ``GpuRow.observed`` entries; failed destructions are
    carried over for the same instance (same profile, start and uuid)."""
    attempts = {(*mig_key(o), o.get("uuid")): o.get("attempts", 0) for o in before or ()}
    return [
        {
            "profile": i.profile,
            "start": i.start,
            "uuid": i.uuid,
            "processes": i.processes,
            "attempts": attempts.get((i.profile, i.start, i.uuid), 0),
        }
        for i in instances
    ]


RULES: dict[type[c.Command], Rule] = {
    c.PutInventory: _put_inventory,
    c.SetOutside: _set_outside,
    c.Rebind: _rebind,
}
