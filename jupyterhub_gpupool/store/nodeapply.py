"""The one applier's part for the nodes and inventory: the rows (and audit events) of an
agent's inventory, a node's reachability, a drain's deadline, outside marks, a rebound lease,
a GPU's cordon and its re-partitions, and what a node did with its MIG plan
(``pool.effects``' "nodes and inventory" effects; the allocator's part is
``pool.effects.apply_effect``). ``store/apply.py``'s ``_apply_effects`` calls these, in the
effects' order, in the command's transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.effects import (
    DrainDeadline,
    GpuCordoned,
    InventoryTaken,
    LeaseNoted,
    MigCreated,
    MigDestroyed,
    MigFailed,
    MigRowsSet,
    NodeReachable,
    NodeReported,
    OutsideSet,
    Rebound,
    RepartitionApplying,
    RepartitionClosed,
    RepartitionOpened,
)
from ..timeparse import format_time
from .core import StoreCore
from .rows import from_epoch, node_row, slot_row

#: The effects this part applies, by the method that applies them.
INVENTORY_EFFECTS = (NodeReported, InventoryTaken)
NODE_EFFECTS = (NodeReachable, DrainDeadline, OutsideSet, Rebound)
MIG_EFFECTS = (MigCreated, MigFailed, MigDestroyed, MigRowsSet, LeaseNoted)
REPARTITION_EFFECTS = (GpuCordoned, RepartitionOpened, RepartitionApplying, RepartitionClosed)


class NodeApplier(StoreCore):
    """Writes the nodes' and inventory's effects into rows."""

    def _inventory_changed(self, db: Session, effect: NodeReported | InventoryTaken) -> None:
        """An agent's inventory: the node's row and its GPUs' (a GPU it no longer has goes,
        its leases ended before), their instance rows and reported entries; its audit."""
        if isinstance(effect, InventoryTaken):
            data = {"node": effect.node, "gpus": effect.gpus}
            self._event(db, "inventory", effect.actor, data=data)
            return
        node = effect.node
        row = node_row(db, node, "agent", self.clock())
        by_uuid = {g.uuid: g for g in row.gpus}
        keep = []
        for gpu, rows, observed in zip(node.gpus, effect.rows, effect.observed, strict=True):
            g = by_uuid.pop(gpu.uuid, None) or orm.GpuRow(uuid=gpu.uuid)
            g.index, g.model = gpu.index, gpu.model.name
            g.memory_mib = round(gpu.model.memory_gb * 1024)
            g.mig_enabled, g.dynamic_mig = gpu.mig_enabled, gpu.dynamic_mig
            g.sharing, g.healthy = gpu.sharing, gpu.healthy
            g.observed = None if observed is None else [dict(o) for o in observed]
            set_instance_rows(db, g, rows)
            keep.append(g)
        row.gpus = keep

    def _node_changed(
        self,
        db: Session,
        effect: NodeReachable | DrainDeadline | OutsideSet | Rebound,
        actor: str,
        known: Mapping[str, orm.LeaseRow],
    ) -> None:
        """A node's reachability, drain deadline, outside marks, or a lease rebound on it."""
        if isinstance(effect, Rebound):
            self._rebound(db, effect, actor, known)
            return
        node = orm.NodeRow.find(db, effect.node)
        if isinstance(effect, NodeReachable):
            if node is None:
                return
            node.unreachable = not effect.reachable
            data: dict[str, Any] = {"node": effect.node}
            if effect.reachable:
                self._event(db, "node-reachable", "system", data=data)
            else:
                data["last_seen"] = format_time(node.last_seen)
                self._event(db, "node-unreachable", "system", data=data)
        elif isinstance(effect, DrainDeadline):
            deadline = format_time(from_epoch(effect.deadline))
            data = {"node": effect.node, "deadline": deadline, "noticed": effect.noticed}
            self._event(db, "node-drain-deadline", actor, data=data)
        else:
            holds = effect.holds
            if node is not None:
                node.outside = None if holds.empty else holds.to_json()
            data = {
                "node": effect.node,
                "counts": dict(holds.counts),
                "gpus": list(holds.gpus),
                "instances": [list(i) for i in holds.instances],
                "short": dict(holds.short),
                "pods": list(holds.pods),
                **({"conflicts": list(holds.conflicts)} if holds.conflicts else {}),
            }
            self._event(db, "outside-holds", actor, data=data)

    def _repartition_changed(
        self,
        db: Session,
        effect: GpuCordoned | RepartitionOpened | RepartitionApplying | RepartitionClosed,
        actor: str,
    ) -> None:
        """A GPU's cordon, and a re-partition's row: opened, applying (the agent's GPU gets its
        layout's instance rows), closed."""
        now = self.clock()
        g = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == effect.gpu))
        if isinstance(effect, GpuCordoned):
            if g is not None:
                g.cordoned = effect.cordoned
            return
        if isinstance(effect, RepartitionOpened):
            rep = orm.MigRepartitionRow(
                node=effect.node,
                gpu_uuid=effect.gpu,
                layout=[{"profile": p, "start": s} for p, s in effect.layout],
                method=effect.method,
                state="waiting",
                actor=actor,
                created=now,
                updated=now,
                was_cordoned=effect.was_cordoned,
            )
            db.add(rep)
            db.flush()
            self._event(db, "mig-repartition", actor, data={"id": rep.id, **effect.plan})
            return
        rep = self.repartition_row(db, effect.rep, effect.gpu)
        if isinstance(effect, RepartitionApplying):
            rep.state, rep.updated = "applying", now
            if effect.instances is not None and g is not None:
                target = list(effect.layout)
                kept = {
                    (i.profile, i.start): i for i in g.instances if (i.profile, i.start) in target
                }
                if len(kept) != len(g.instances):
                    g.instances = list(kept.values())
                    db.flush()  # delete before inserting: a new instance may take a start
                g.instances = [
                    kept.get(key) or orm.MigInstanceRow(profile=key[0], start=key[1])
                    for key in target
                ]
            self._event(db, "mig-repartition-applying", rep.actor, data=rep_data(rep))
            return
        rep.state, rep.error, rep.updated = effect.state, effect.error, now
        if g is not None and effect.cordoned is not None:
            g.cordoned = effect.cordoned
        kind = {"done": "mig-repartitioned", "failed": "mig-failed"}.get(
            effect.state, "mig-repartition-cancelled"
        )
        self._event(db, kind, actor, data={**rep_data(rep), "error": effect.error})

    def _mig_changed(
        self,
        db: Session,
        effect: MigCreated | MigFailed | MigDestroyed | MigRowsSet | LeaseNoted,
        actor: str,
        known: Mapping[str, orm.LeaseRow],
    ) -> None:
        """What a node did with its MIG plan: audited, told to the leases, and the GPU's
        instance rows and reported entries as they are after it."""
        if isinstance(effect, LeaseNoted):
            noted = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
            noted.message = effect.message
            return
        if isinstance(effect, MigRowsSet):
            g = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == effect.gpu))
            if g is None:
                return
            set_instance_rows(db, g, effect.rows)
            g.observed = None if effect.observed is None else [dict(o) for o in effect.observed]
            return
        data: dict[str, Any] = {"node": effect.node, "gpu": effect.gpu}
        if isinstance(effect, MigDestroyed):
            data |= {"op": "destroy", "profile": effect.profile, "start": effect.start}
            self._event(db, "mig-destroyed", actor, None, {**data, "error": effect.error})
            return
        lease = None
        if effect.lease_id is not None:
            lease = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
        if isinstance(effect, MigCreated):
            if lease is not None and effect.renew:
                lease.expires = self.clock() + timedelta(seconds=self.grant_timeout)
                lease.message = None
            data |= {"profile": effect.profile, "start": effect.start, "mig_uuid": effect.uuid}
            self._event(db, "mig-created", "system", lease, data)
            return
        data |= {"op": effect.op, "profile": effect.profile, "start": effect.start}
        data["error"] = effect.error
        if effect.attempt is not None:
            data["attempt"] = effect.attempt
        self._event(db, "mig-failed", "system" if effect.system else actor, lease, data)
        if lease is not None and effect.message is not None:
            lease.message = effect.message

    @staticmethod
    def repartition_row(db: Session, rep_id: int, gpu: str) -> orm.MigRepartitionRow:
        """Re-partition ``rep_id``'s row; 0: the open one of ``gpu`` (opened just now)."""
        if rep_id:
            found = db.get(orm.MigRepartitionRow, rep_id)
        else:
            found = db.scalar(
                select(orm.MigRepartitionRow).where(
                    orm.MigRepartitionRow.gpu_uuid == gpu,
                    orm.MigRepartitionRow.state.in_(("waiting", "applying")),
                )
            )
        assert found is not None  # the rule read it
        return found

    def _rebound(
        self, db: Session, effect: Rebound, actor: str, known: Mapping[str, orm.LeaseRow]
    ) -> None:
        """The slots of a lease rebound (and of those it swaps with) and the node's marks."""
        result, lease_id = effect.rebinding, effect.lease_id
        moving = {lease_id: result.slots, **result.others}
        rows = {lid: known.get(lid) or self.lease_row(db, lid) for lid in moving}
        for r in rows.values():
            for slot in [s for s in r.slots if s.live]:
                r.slots.remove(slot)  # delete-orphan: gone at the flush
        db.flush()  # the old slots leave the unique index before the new ones enter it
        for lid, r in rows.items():
            for moved in moving[lid]:
                r.slots.append(slot_row(moved, create=False))
        node_row = orm.NodeRow.find(db, effect.node)
        if node_row is not None and (node_row.outside or not result.outside.empty):
            node_row.outside = result.outside.to_json()
        data = {
            "node": effect.node,
            "devices": list(effect.devices),
            "moved": [list(m) for m in result.moved],
            "swapped": sorted(result.others),
        }
        self._event(db, "rebound", actor, rows[lease_id], data)
        before = dict(effect.before)
        for lid in result.others:
            keys = zip(before[lid], [s.key for s in moving[lid]], strict=True)
            data = {
                "node": effect.node,
                "moved": [[a, b] for a, b in keys if a != b],
                "swapped": [lease_id],
            }
            self._event(db, "rebound", actor, rows[lid], data)


def set_instance_rows(
    db: Session, g: orm.GpuRow, rows: Iterable[tuple[str, int, str | None, int, str | None]]
) -> None:
    """A GPU's MIG instance rows become ``rows`` ((profile, start, uuid, failed creations,
    the last error)): a row of the same (profile, start) is kept, the others go."""
    by_key = {(i.profile, i.start): i for i in g.instances}
    keep = []
    for profile, start, uuid, attempts, error in rows:
        row = by_key.get((profile, start)) or orm.MigInstanceRow(profile=profile, start=start)
        row.uuid, row.attempts, row.error = uuid, attempts, error
        keep.append(row)
    if any(r not in keep for r in g.instances):
        # delete before inserting: a new instance may take a dropped one's start
        g.instances = [r for r in g.instances if r in keep]
        db.flush()
    g.instances = keep


def rep_data(rep: orm.MigRepartitionRow) -> dict[str, Any]:
    """What a re-partition's audit events say of it."""
    return {"id": rep.id, "node": rep.node, "gpu": rep.gpu_uuid, "layout": rep.layout}
