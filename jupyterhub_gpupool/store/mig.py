"""Dynamic MIG in the store: the plan per node, what the nodes did with it, and readiness.

Two views of a dynamic GPU live side by side. ``MigInstanceRow``\\ s are the layout the pool
*wants* (what the allocator places on: declared instances, instances planned for grants, held
ones). ``GpuRow.observed`` is what the node last *reported*. ``pool.migplan`` turns the two
into actions; this module feeds it, and what a node did with it (``mig_results``) is decided
by ``pool.decide`` (``pool.rules.mig``) and applied by the one applier:

* a planned instance the node made gets its ``MIG-…`` uuid: the lease holding it is *ready*,
  and its grant gets the full ``grant_timeout`` again, counted from then;
* a failed creation is audited (``mig-failed``, with the NVML error) and told to the lease; the
  instance is retried until ``mig_attempts`` failures, then the grant is released
  (``mig-failed``): placing it again would pick the same spot, while a clear failure lets the
  spawner tell the user;
* an instance the pool made for a lease that ended stays occupied for the allocator (``RETIRING``)
  until the node destroyed it, which it is asked to only while no process runs on it.

"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from .. import orm
from ..pool import commands as c
from ..pool.dramig import made_by_claim
from ..pool.facts import MigGpu, PoolState
from ..pool.migplan import GpuLayout, Seen, Wanted, plan_node
from ..pool.model import Node
from ..pool.repartition import Held
from .apply import Applier, LazyFacts, decided
from .read.mig import (
    MigAction,
    ModelProfilesView,
    mig_actions,
    model_profiles,
    repartitioned_node,
)
from .rows import live_slots


class MigStore(Applier):
    """Dynamic MIG: the plan per node, and what the nodes did with it."""

    # -- the plan ------------------------------------------------------------------------------

    def _layout(self, g: orm.GpuRow) -> GpuLayout:
        return GpuLayout(
            g.uuid,
            self.catalog.model_for_nvml(g.model, g.memory_mib),
            tuple(Wanted(i.profile, i.start, i.attempts) for i in g.instances),
            tuple(
                Seen(
                    o["profile"],
                    o["start"],
                    o.get("uuid"),
                    o.get("processes"),
                    o.get("attempts", 0),
                )
                for o in g.observed or ()
            ),
        )

    def mig_profiles(self, *, fresh: bool = False) -> tuple[ModelProfilesView, ...]:
        """The MIG profiles of the pool's MIG-capable models (``read.mig``), for the admin
        nodes page's form: ``fresh=False``, the catalog's profiles hardly ever change."""
        with self.locked(fresh=fresh) as alloc:
            return model_profiles(alloc)

    def repartitioned_node(
        self, node: str, layouts: Mapping[str, Iterable[tuple[str, int]]]
    ) -> Node | None:
        """``node`` as label re-partitions to ``layouts`` (GPU uuid → the ``(profile,
        start)`` of each instance) will leave it, nothing held: a copy, to report as its
        inventory (``read.mig.repartitioned_node``); None: not a node of the pool."""
        with self.locked() as alloc:
            return repartitioned_node(alloc, node, layouts)

    def mig_plan(self, node: str) -> tuple[MigAction, ...]:
        """The MIG actions pending on ``node``'s dynamic GPUs (empty for every other node).

        Only GPUs whose node reported an inventory are planned for: nobody else could act.
        Waits for a decision in flight in this process, and catches up with those another
        process was told to have committed, so a plan asked for right after a grant includes it.
        """
        with self.locked() as alloc:  # most nodes have no dynamic MIG: answer without the rows
            gpus = alloc.nodes[node].gpus if node in alloc.nodes else []
            # the DRA driver's GPUs: their claims make and remove instances, not the agent
            agents = {
                g.uuid for g in gpus if g.mig_enabled and g.dynamic_mig and not g.mig_by_claim
            }
            if not agents:
                return ()
        with self._thread_lock, self.read() as db:
            rows = db.scalars(
                select(orm.GpuRow)
                .join(orm.NodeRow)
                .where(orm.NodeRow.name == node, orm.GpuRow.dynamic_mig, orm.GpuRow.mig_enabled)
                .options(selectinload(orm.GpuRow.instances))
                .order_by(orm.GpuRow.index)
            )
            layouts = [self._layout(g) for g in rows if g.observed is not None and g.uuid in agents]
        return mig_actions(plan_node(layouts, self.mig_attempts))

    # -- what the node did ---------------------------------------------------------------------

    def _mig_gpu(self, g: orm.GpuRow, held: Sequence[Held] = ()) -> MigGpu:
        """What the MIG rules read of a GPU's row (``pool.facts.MigGpu``; ``held``: what
        holds it now, for a re-partition)."""
        by_claim = made_by_claim(g.node.name, g.node.cluster, True, self.dra_dynamic_mig)
        return MigGpu(
            g.uuid,
            g.node.name,
            self.catalog.model_for_nvml(g.model, g.memory_mib),
            g.mig_enabled,
            g.dynamic_mig,
            g.cordoned,
            tuple((i.profile, i.start, i.uuid, i.attempts, i.error) for i in g.instances),
            None if g.observed is None else tuple(g.observed),
            tuple(held),
            by_claim,
        )

    def mig_results(
        self, node: str, results: Iterable[Mapping[str, Any]], *, actor: str = ""
    ) -> dict[str, Any]:
        """Record what a node's agent did with its plan (one result per action it applied;
        ``pool.decide``: ``pool.rules.mig``).

        A creation that worked makes its lease ready; one that failed is audited, told to the
        lease and retried up to ``mig_attempts`` times. A destruction that worked (or found
        nothing: ``NotFound``) frees the memory slices, and the queue is served at once.
        ``InUse`` (processes appeared) is no failure: it waits for the next inventory.
        """
        results = list(results)
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, node)
            gpus = None if row is None else tuple(self._mig_gpu(g) for g in row.gpus)
            slots = []
            if row is not None:
                slots = live_slots(db, (g.uuid for g in row.gpus), mig_only=True)
            holders = {
                (s.gpu_uuid, s.profile or "", s.start or 0): (s.lease_id, s.lease.state)
                for s in slots
            }
            leases = LazyFacts(self, db, alloc, [s.lease for s in slots])
            state = PoolState(
                alloc,
                leases,
                mig_node=gpus,
                mig_holders=holders,
                mig_attempts=self.mig_attempts,
            )
            outcome = decided(state, c.MigResults(node, results), self._now_s())
            rows = {s.lease_id: s.lease for s in slots} | leases.read
            self._apply_effects(db, alloc, outcome.effects, actor, rows)
            answer: dict[str, Any] = outcome.answer
            return answer
