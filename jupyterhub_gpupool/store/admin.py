"""What admins and agents change: the pool config, nodes (inventory, cordon, drain), quotas,
and the busy hours the samples add to leases."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.facts import ConfigRows, NodeRows, PoolState
from ..pool.model import Node
from ..pool.outside import OutsideHolds
from ..pool.usage import BusyTime, period_closed
from ..poolconfig import PoolConfig
from .apply import LazyFacts, decided, lease_facts
from .mig import MigStore
from .read.nodes import NodeSetView, NodeView, node_set_view, node_view
from .read.quotas import QuotaView
from .rows import (
    check_quota_kind,
    live_slots,
    reclaim_state,
    upsert_insert,
)
from .utilization import SampleFields, put_samples
from .views import ViewStore

log = logging.getLogger(__name__)


class AdminStore(MigStore, ViewStore):
    """Configuration, inventory and quotas."""

    # -- the pool config file ----------------------------------------------------------------

    def load_config(self, config: PoolConfig) -> None:
        """Make the database match the pool config file, except what admins changed by API
        (``pool.decide``: ``pool.rules.config``).

        Nodes from the file are added or updated; offers and quotas with ``source='api'`` win
        over the file until an admin resets them. The allocator changes in place with the rows
        (never rebuilt), and the queue is served with what the pool has then.
        """
        # The rows' facts read the new file (its clusters); a refused file leaves the old one.
        previous, self.file_config = self.file_config, config
        try:
            with self.transaction() as (db, alloc):
                rows, live = self._config_rows(db, config)
                leases = LazyFacts(self, db, alloc, live)
                state = PoolState(
                    alloc,
                    leases,
                    mig_attempts=self.mig_attempts,
                    dra=frozenset(self.dra_dynamic_mig),
                    config_rows=rows,
                )
                outcome = decided(state, c.LoadConfig(config), self._now_s())
                known = {r.id: r for r in live} | leases.read
                self._apply_effects(db, alloc, outcome.effects, "system", known)
        except BaseException:
            self.file_config = previous
            raise

    def _config_rows(
        self, db: Session, config: PoolConfig
    ) -> tuple[ConfigRows, list[orm.LeaseRow]]:
        """What the rows hold now that loading ``config`` may change (``pool.facts``), and
        the rows of the queued requests and of the live leases on the declared nodes."""
        queued = list(
            db.scalars(
                select(orm.LeaseRow)
                .where(orm.LeaseRow.state == "queued")
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
            )
        )
        declared = [g.uuid for n in config.nodes for g in n.gpus]
        owners = db.execute(
            select(orm.GpuRow.uuid, orm.NodeRow.name)
            .join(orm.NodeRow)
            .where(orm.GpuRow.uuid.in_(declared))
        )
        nodes: dict[str, NodeRows] = {}
        outside: dict[str, OutsideHolds] = {}
        live: dict[str, orm.LeaseRow] = {r.id: r for r in queued}
        for node in config.nodes:
            row = orm.NodeRow.find(db, node.name)
            if row is not None:
                slots = live_slots(db, (g.uuid for g in row.gpus))
                nodes[node.name] = self._node_rows(row, slots)
                outside[node.name] = OutsideHolds.from_json(row.outside)
                live.update((s.lease_id, s.lease) for s in slots)
        offers = list(db.scalars(select(orm.OfferRow)))
        rows = ConfigRows(
            offers={r.name: r.source for r in offers},
            quotas={(q.kind, q.name): q.source for q in db.scalars(select(orm.QuotaRow))},
            queued=tuple(lease_facts(r) for r in queued),
            currencies=frozenset(db.scalars(select(orm.PriceRow.currency).distinct())),
            positions={r.name: r.position for r in offers},
            nodes=nodes,
            outside=outside,
            owners={uuid: name for uuid, name in owners},
        )
        return rows, list(live.values())

    # -- nodes -------------------------------------------------------------------------------

    def put_inventory(self, node: Node, *, actor: str = "") -> NodeView:
        """An agent's report of a node: add or update it, end the leases on what it lost
        (``pool.decide``: ``pool.rules.inventory``).

        A cluster the pool config does not list is refused (``unknown_cluster``, with the
        known ones): an agent pointed at the wrong pool, or a typo, must not add capacity."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, node.name)
            slots: list[orm.LeaseSlotRow] = []
            if row is not None:
                slots = live_slots(db, (g.uuid for g in row.gpus))
            leases = LazyFacts(self, db, alloc, [s.lease for s in slots])
            elsewhere = db.execute(
                select(orm.GpuRow.uuid, orm.NodeRow.name)
                .join(orm.NodeRow)
                .where(
                    orm.GpuRow.uuid.in_([g.uuid for g in node.gpus]),
                    orm.NodeRow.name != node.name,
                )
            )
            state = PoolState(
                alloc,
                leases,
                outside=OutsideHolds.from_json(row.outside if row is not None else None),
                mig_attempts=self.mig_attempts,
                clusters=tuple(self.file_config.clusters),
                node_rows=None if row is None else self._node_rows(row, slots),
                elsewhere={uuid: name for uuid, name in elsewhere},
                dra=frozenset(self.dra_dynamic_mig),
            )
            outcome = decided(state, c.PutInventory(node, actor=actor), self._now_s())
            known = {s.lease_id: s.lease for s in slots} | leases.read
            self._apply_effects(db, alloc, outcome.effects, "system", known)
            row = orm.NodeRow.find(db, node.name)
            assert row is not None  # written by the effects
            db.flush()
            return node_view(row)

    def _node_rows(self, row: orm.NodeRow, slots: Sequence[orm.LeaseSlotRow]) -> NodeRows:
        """What an inventory's rule reads of a node's rows (``pool.facts.NodeRows``; ``slots``:
        the live slots on its GPUs, by lease id)."""
        leases: dict[str, dict[str, None]] = {g.uuid: {} for g in row.gpus}
        for s in slots:
            leases[s.gpu_uuid][s.lease_id] = None
        return NodeRows(
            unreachable=row.unreachable,
            cordoned=row.cordoned,
            draining=row.draining,
            gpus=tuple(self._mig_gpu(g) for g in row.gpus),
            sharing={g.uuid: g.sharing for g in row.gpus},
            leases={uuid: tuple(ids) for uuid, ids in leases.items()},
            slots={
                (s.gpu_uuid, s.profile or "", s.start or 0): (s.lease_id, s.lease.state, s.create)
                for s in slots
                if s.kind == "mig"
            },
        )

    def set_sharing(
        self, name: str, modes: Mapping[str, str], *, actor: str = ""
    ) -> dict[str, Any]:
        """Set the sharing modes of a node's GPUs (uuid → ``shared`` | ``exclusive``) as its
        device plugin advertises them (``pool.sharing``; ``pool.decide`` decides). Leases keep
        what they hold; a change is audited (``sharing-advertised``) and the queue served.
        Returns what changed."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, name)
            gpus = tuple((g.uuid, g.sharing, g.mig_enabled) for g in row.gpus) if row else ()
            state = PoolState(alloc, node_known=row is not None, node_gpus=gpus)
            outcome = decided(state, c.SetSharing(name, modes), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
            changed: dict[str, Any] = outcome.answer
            return changed

    def _gpu_leases(self, db: Session, gpu_uuid: str) -> list[orm.LeaseRow]:
        """The live leases holding a slot of the GPU ``gpu_uuid``."""
        return list(
            db.scalars(
                select(orm.LeaseRow)
                .join(orm.LeaseSlotRow)
                .where(orm.LeaseSlotRow.gpu_uuid == gpu_uuid, orm.LeaseSlotRow.live)
                .order_by(orm.LeaseRow.id)
            ).unique()
        )

    def set_node(self, name: str, action: str, *, actor: str = "") -> NodeSetView:
        """cordon / uncordon / drain a node (``pool.decide``); an uncordon serves the queue
        and withdraws the drain notices of the node's leases that no one is carrying out yet:
        ``withdrawn`` lists them."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, name)
            noticed: list[orm.LeaseRow] = []
            if row is not None and action == "uncordon":
                noticed = list(
                    db.scalars(
                        select(orm.LeaseRow)
                        .where(orm.LeaseRow.node == name, orm.LeaseRow.state == "reclaiming")
                        .order_by(orm.LeaseRow.granted, orm.LeaseRow.id)
                    ).all()
                )
            policies = self.reclaim_policies(db, alloc.offers) if noticed else None
            drained = tuple(
                (
                    lease_facts(r),
                    reclaim_state(r),
                    policies.for_offer(alloc.offers.get(r.offer) or r.offer).extension,
                )
                for r in noticed
                if policies is not None
            )
            state = PoolState(alloc, node_known=row is not None, drained=drained)
            outcome = decided(state, c.SetNode(name, action), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, {r.id: r for r in noticed})
            assert row is not None  # else refused
            return node_set_view(row, outcome.answer if action == "uncordon" else None)

    # -- quotas ------------------------------------------------------------------------------

    def put_quota(
        self, kind: str, name: str, raw: Mapping[str, object], *, actor: str = ""
    ) -> QuotaView:
        """Set a user's or group's quota by API (wins over the file). Lowering it below current
        use is allowed: the leases beyond the new guarantee become borrowed."""
        return self._set_quota(c.PutQuota(kind, name, raw), actor)

    def patch_quota(
        self, kind: str, name: str, raw: Mapping[str, object], *, actor: str = ""
    ) -> QuotaView:
        """Change only the fields ``raw`` names of the quota now in effect for a user or group
        (their own, the file's, or for a user the default) and store it by API."""
        return self._set_quota(c.PatchQuota(kind, name, raw), actor)

    def _set_quota(self, command: c.PutQuota | c.PatchQuota, actor: str) -> QuotaView:
        """Decide a quota edit (``pool.decide``) and apply it."""
        check_quota_kind(command.kind)
        with self.transaction() as (db, alloc):  # holds the pool lock: nobody changes it between
            current = None
            if isinstance(command, c.PatchQuota):
                current = self.get_quota(command.kind, command.name)
            outcome = decided(PoolState(alloc, quota=current), command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
            answer: QuotaView = outcome.answer  # the rule's QuotaInEffect
            return answer

    def reset_quota(self, kind: str, name: str, *, actor: str = "") -> QuotaView:
        """Drop an admin's API override: the pool config file's quota (or the default) applies."""
        k = check_quota_kind(kind)
        from_file = (self.file_config.users if k == "user" else self.file_config.groups) or {}
        with self.transaction() as (db, alloc):
            row = db.scalar(
                select(orm.QuotaRow).where(orm.QuotaRow.kind == k, orm.QuotaRow.name == name)
            )
            state = PoolState(
                alloc,
                quota_override=row is not None and row.source == "api",
                file_quota=from_file.get(name),
            )
            outcome = decided(state, c.ResetQuota(kind, name), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
        return self.get_quota(kind, name)

    # -- busy hours ----------------------------------------------------------------------------

    def add_busy(
        self,
        usage: Mapping[tuple[str, datetime], BusyTime],
        *,
        node: str | None = None,
        samples: Sequence[SampleFields] = (),
    ) -> int:
        """Record busy time per lease and hour (``pool.usage``: from utilization samples), keep
        the batch's raw ``samples`` for the reclaim rounds (``utilization_samples``) and note
        that ``node``'s agent is alive; no pool lock needed, unless the node was unreachable.

        The samples are committed before the agent's POST is answered, so every replica's next
        round sees them. An hour of a closed month (``pool.usage.period_closed``) is not
        recorded: a finished month never changes. The lease's running total (``busy_hours``,
        lease-hours) grows by the same seconds. Returns how many (lease, hour) facts were
        dropped as closed.
        """
        if not usage and node is None and not samples:
            return 0
        now = self.clock()
        facts = {k: v for k, v in usage.items() if not period_closed(k[1], now)}
        dropped = len(usage) - len(facts)
        back = False
        with self.writing() as db:
            put_samples(db, samples)
            if facts:
                self._record_usage(db, facts)
            if node is not None:
                row = orm.NodeRow.find(db, node)
                if row is not None:
                    row.last_seen = now
                    back = row.unreachable
        if back:
            self._reachable_again(c.AddBusy(usage, node, samples))
        return dropped

    def _record_usage(self, db: Session, facts: Mapping[tuple[str, datetime], BusyTime]) -> None:
        """Upsert (lease, hour) busy time; add each lease's seconds to its running total."""
        per_lease: dict[str, float] = {}
        for (lease, _), (busy, _e) in facts.items():
            per_lease[lease] = per_lease.get(lease, 0.0) + busy
        known = set(db.scalars(select(orm.LeaseRow.id).where(orm.LeaseRow.id.in_(list(per_lease)))))
        keys = sorted(k for k in facts if k[0] in known)
        if not keys:
            return
        t = orm.LeaseUsageRow.__table__.c
        rows = [
            {"lease_id": k[0], "hour": k[1], "busy_seconds": facts[k][0],
             "estimated_seconds": facts[k][1]}
            for k in keys
        ]  # fmt: skip
        for i in range(0, len(rows), 200):  # well under SQLite's bound-parameter limit
            stmt = upsert_insert(db, orm.LeaseUsageRow).values(rows[i : i + 200])
            stmt = stmt.on_conflict_do_update(
                index_elements=[t.lease_id, t.hour],
                set_={
                    "busy_seconds": t.busy_seconds + stmt.excluded.busy_seconds,
                    "estimated_seconds": t.estimated_seconds + stmt.excluded.estimated_seconds,
                },
            )
            db.execute(stmt)
        for row in db.scalars(select(orm.LeaseRow).where(orm.LeaseRow.id.in_(sorted(known)))):
            row.busy_hours += per_lease[row.id] / 3600.0

    def _reachable_again(self, command: c.AddBusy) -> None:
        """An unreachable node's agent reports again (``pool.decide``): it takes grants
        again, and the queue is served."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, command.node or "")
            state = PoolState(alloc, unreachable=row is not None and row.unreachable)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects)

    def mark_unreachable(self, silent_since: datetime) -> list[str]:
        """Nodes whose agent has said nothing since ``silent_since`` take no new grants
        (their leases stay until an admin or the node decides; ``pool.decide``); returns
        their names."""
        with self.transaction() as (db, alloc):
            silent = db.scalars(
                select(orm.NodeRow.name).where(
                    orm.NodeRow.source == "agent",
                    orm.NodeRow.unreachable.is_(False),
                    orm.NodeRow.last_seen < silent_since,
                )
            ).all()
            state = PoolState(alloc, silent=tuple(silent))
            outcome = decided(state, c.MarkUnreachable(silent_since), self._now_s())
            self._apply_effects(db, alloc, outcome.effects)
            names: list[str] = outcome.answer
            return names
