"""What the cluster says about devices: held outside the pool, and the device a pod really got.

Both are commands like the others (``pool.commands``, through the service's writer, one
transaction under the pool lock), decided by ``pool.decide`` (``pool.rules.inventory``, over
``pool.outside``'s rules); the store gathers the node's marks and applies the effects.
``set_outside`` records the marks on a node (``nodes.outside``) and, when marks go away, serves
the queue with what they free; ``rebind`` moves a lease's slots to the devices its pod runs on
(audit ``rebound``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import orm
from ..pool import commands as c
from ..pool.facts import PoolState
from ..pool.outside import Held, OutsideHolds
from .apply import decided, lease_facts
from .leases import LeaseStore
from .read.devices import ClusterView, cluster_view
from .read.leases import LeaseView


class OutsideStore(LeaseStore):
    """Outside holds per node, and rebinding leases to their real devices."""

    def cluster(self, name: str) -> ClusterView:
        """The pool's nodes of cluster ``name`` with their GPUs, and the live leases
        (``read.devices``): what the Kubernetes readers of time-slicing and of outside holds
        compare the API server's nodes with."""
        with self.locked() as alloc:
            return cluster_view(alloc, name)

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
            outside = OutsideHolds.from_json(row.outside if row is not None else None)
            state = PoolState(alloc, node_known=row is not None, outside=outside)
            command = c.SetOutside(node, counts, pods, devices)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, "kube")
            answer: dict[str, Any] = outcome.answer
            return answer

    def rebind(
        self,
        lease_id: str,
        devices: Sequence[str],
        exclusive: bool = False,
        *,
        actor: str = "",
    ) -> LeaseView:
        """The lease's server runs on ``devices`` (GPU uuids, MIG device uuids, replica ids)
        of its node, not on what the pool chose: the lease holds those from now on (and what
        held them takes what it leaves; ``exclusive``: a device another lease holds is
        refused). Saying what the lease has already changes nothing."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            lease = alloc.leases.get(lease_id)
            node_row = orm.NodeRow.find(db, lease.node) if lease is not None else None
            outside = OutsideHolds.from_json(node_row.outside if node_row else None)
            state = PoolState(alloc, {lease_id: lease_facts(row)}, outside=outside)
            command = c.Rebind(lease_id, devices, exclusive)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, {lease_id: row})
            return self._lease_view(db, alloc, row)
