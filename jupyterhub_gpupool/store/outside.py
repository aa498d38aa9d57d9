"""What the cluster says about devices: held outside the pool, and the device a pod really got.

Both are commands like the others (``pool.commands``, through the service's writer, one
transaction under the pool lock); the rules are ``pool.outside``'s. ``set_outside`` records the
marks on a node (``nodes.outside``) and, when marks go away, serves the queue with what they free;
``rebind`` moves a lease's slots to the devices its pod runs on (audit ``rebound``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import orm
from ..pool.leases import LIVE_STATES
from ..pool.outside import Held, OutsideHolds, mark_exact, place_outside, rebind
from .errors import StoreError
from .leases import LeaseStore
from .rows import new_row


class OutsideStore(LeaseStore):
    """Outside holds per node, and rebinding leases to their real devices."""

    def set_outside(
        self,
        node: str,
        counts: Mapping[str, int],
        pods: Sequence[str] = (),
        devices: Sequence[Held] | None = None,
    ) -> dict[str, Any]:
        """Pods the pool did not place hold ``counts`` devices of ``node`` (``gpu``: whole
        GPUs; a MIG profile: instances of it): mark that many, never grant them; or, with
        ``devices`` (DRA), exactly those. Returns the marks (``OutsideHolds.to_json``); an
        unknown node is the ``not_found`` refusal."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, node)
            if row is None or node not in alloc.nodes:
                raise StoreError("not_found", f"no node {node!r}", field="node")
            before = OutsideHolds.from_json(row.outside)
            if devices is None:
                after = place_outside(alloc.nodes[node], counts, before, pods)
            else:
                after = mark_exact(alloc.nodes[node], devices)
            if after == before:
                return after.to_json()
            row.outside = None if after.empty else after.to_json()
            alloc.set_outside(node, after)
            self._event(
                db,
                "outside-holds",
                "kube",
                data={
                    "node": node,
                    "counts": dict(after.counts),
                    "gpus": list(after.gpus),
                    "instances": [list(i) for i in after.instances],
                    "short": dict(after.short),
                    "pods": list(after.pods),
                    **({"conflicts": list(after.conflicts)} if after.conflicts else {}),
                },
            )
            if len(after.gpus) + len(after.instances) < len(before.gpus) + len(before.instances):
                self._serve_queue(db, alloc)  # a device came back: whoever waits may have it
            return after.to_json()

    def rebind(
        self,
        lease_id: str,
        devices: Sequence[str],
        exclusive: bool = False,
        *,
        actor: str = "",
    ) -> dict[str, Any]:
        """The lease's server runs on ``devices`` (GPU uuids, MIG device uuids, replica ids)
        of its node, not on what the pool chose: the lease holds those from now on (and what
        held them takes what it leaves; ``exclusive``: a device another lease holds is
        refused). Saying what the lease has already changes nothing."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            lease = alloc.leases.get(lease_id)
            if row.state not in LIVE_STATES or lease is None:
                raise StoreError("not_live", f"lease {lease_id} is {row.state}", field="id")
            if not lease.slots:
                raise StoreError(
                    "device_mismatch", f"lease {lease_id} holds no GPU", field="device"
                )
            node = alloc.nodes[lease.node]
            node_row = orm.NodeRow.find(db, node.name)
            outside = OutsideHolds.from_json(node_row.outside if node_row else None)
            held = {
                other.id: other.slots
                for other in alloc.leases.values()
                if other.node == node.name and other.id != lease_id
            }
            result = rebind(lease_id, lease.slots, devices, node, held, outside, exclusive)
            if not result.changed:
                return self._lease_json(db, alloc, row)
            before = {lid: [s.key for s in alloc.leases[lid].slots] for lid in held}
            alloc.rebind(lease_id, result, node.name)
            moving = {lease_id: result.slots, **result.others}
            rows = {lid: row if lid == lease_id else self.lease_row(db, lid) for lid in moving}
            for r in rows.values():
                for slot in [s for s in r.slots if s.live]:
                    r.slots.remove(slot)  # delete-orphan: gone at the flush
            db.flush()  # the old slots leave the unique index before the new ones enter it
            for lid, r in rows.items():
                for moved in moving[lid]:
                    r.slots.append(
                        new_row(
                            orm.LeaseSlotRow,
                            slot_key=moved.key,
                            gpu_uuid=moved.gpu,
                            kind=moved.kind,
                            profile=moved.profile,
                            start=moved.start,
                            milli=moved.milli,
                            create=False,
                            live=True,
                        )
                    )
            if node_row is not None and (node_row.outside or not result.outside.empty):
                node_row.outside = result.outside.to_json()
            self._event(
                db,
                "rebound",
                actor,
                row,
                {
                    "node": node.name,
                    "devices": list(devices),
                    "moved": [list(m) for m in result.moved],
                    "swapped": sorted(result.others),
                },
            )
            for lid in result.others:
                self._event(
                    db,
                    "rebound",
                    actor,
                    rows[lid],
                    {
                        "node": node.name,
                        "moved": [
                            [a, b]
                            for a, b in zip(before[lid], [s.key for s in moving[lid]], strict=True)
                            if a != b
                        ],
                        "swapped": [lease_id],
                    },
                )
            return self._lease_json(db, alloc, row)
