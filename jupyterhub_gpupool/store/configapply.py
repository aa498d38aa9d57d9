"""The one applier's part for the pool config's load (``pool.rules.config``): the file's offer
and quota rows, a declared node's rows, the prices recorded over time, the audit event (the
allocator's part is ``pool.effects.apply_effect``: it changes in place, never rebuilt).
``store/apply.py``'s ``_apply_effects`` calls these, in the effects' order, in the command's
transaction."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.allocator import Allocator
from ..pool.effects import (
    ConfigLoaded,
    FileQuotaLoaded,
    HeadroomSet,
    NodeDeclared,
    OfferDropped,
    OfferLoaded,
    OffersOrdered,
    PricesLoaded,
)
from ..pool.pricing import Prices, reconcile
from .core import StoreCore
from .nodeapply import set_instance_rows
from .rebuild import used_hours
from .rows import node_row, offer_spec, schedules, set_quota

log = logging.getLogger(__name__)

#: The effects this part applies (``ConfigApplier._config_changed``).
CONFIG_EFFECTS = (
    OfferLoaded,
    OfferDropped,
    OffersOrdered,
    HeadroomSet,
    FileQuotaLoaded,
    PricesLoaded,
    NodeDeclared,
    ConfigLoaded,
)


class ConfigApplier(StoreCore):
    """Writes a config load's effects into rows."""

    def _config_changed(
        self,
        db: Session,
        alloc: Allocator | None,
        effect: OfferLoaded
        | OfferDropped
        | OffersOrdered
        | HeadroomSet
        | FileQuotaLoaded
        | PricesLoaded
        | NodeDeclared
        | ConfigLoaded,
    ) -> None:
        """A config load's effect on the rows (``alloc``: the allocator it was applied to)."""
        if isinstance(effect, (OffersOrdered, HeadroomSet)):
            return  # the allocator's only: the positions are the loads'
        if isinstance(effect, NodeDeclared):
            self._node_declared(db, effect)
        elif isinstance(effect, OfferLoaded):
            offer, spec = effect.offer, offer_spec(effect.offer)
            row = db.get(orm.OfferRow, offer.name)
            if row is None:
                db.add(
                    orm.OfferRow(
                        name=offer.name, spec=spec, source="file", position=effect.position
                    )
                )
            else:
                row.spec, row.position = spec, effect.position
        elif isinstance(effect, OfferDropped):
            dropped = db.get(orm.OfferRow, effect.name)
            if dropped is not None:
                db.delete(dropped)
                db.flush()
        elif isinstance(effect, FileQuotaLoaded):
            quota = db.scalar(
                select(orm.QuotaRow).where(
                    orm.QuotaRow.kind == effect.kind, orm.QuotaRow.name == effect.name
                )
            )
            if effect.spec is None:
                if quota is not None:
                    db.delete(quota)
                return
            if quota is None:
                quota = orm.QuotaRow(kind=effect.kind, name=effect.name, source="file")
                db.add(quota)
            set_quota(quota, effect.spec)
        elif isinstance(effect, PricesLoaded):
            self._record_prices(db, effect.prices)
        else:  # ConfigLoaded
            data = {"offers": effect.offers, "nodes": effect.nodes}
            self._event(db, "config-loaded", "system", data=data)
            db.flush()
            if alloc is not None:  # the budgets the quotas loaded have, as a rebuild counts
                alloc.quotas.used_hours = used_hours(db, alloc.quotas, self.clock())

    def _node_declared(self, db: Session, effect: NodeDeclared) -> None:
        """A declared node's row and its GPUs' (a GPU it no longer declares goes, its leases
        ended before), with their instance rows; what the node reported stays."""
        node = effect.node
        row = node_row(db, node, "config", self.clock())
        by_uuid = {g.uuid: g for g in row.gpus}
        keep = []
        for gpu, rows in zip(node.gpus, effect.rows, strict=True):
            g = by_uuid.pop(gpu.uuid, None) or orm.GpuRow(uuid=gpu.uuid)
            g.index, g.model = gpu.index, gpu.model.name
            g.memory_mib = round(gpu.model.memory_gb * 1024)
            g.mig_enabled, g.dynamic_mig = gpu.mig_enabled, gpu.dynamic_mig
            g.sharing, g.healthy = gpu.sharing, gpu.healthy
            set_instance_rows(db, g, rows)
            keep.append(g)
        row.gpus = keep

    def _record_prices(self, db: Session, prices: Prices) -> None:
        """Record the config's prices over time (``pool.pricing.reconcile``): what was in force
        before the next whole hour stays (the currency is checked by the rule)."""
        rows = list(
            db.scalars(select(orm.PriceRow).order_by(orm.PriceRow.model, orm.PriceRow.start))
        )
        recorded = schedules(rows)
        currencies = {r.currency for r in rows}
        currency = prices.currency if prices.schedule else None
        wanted, ignored = reconcile(recorded, prices, self.clock())
        if ignored:
            log.warning(
                "Prices in the pool config that would change past hours were not applied: %s",
                "; ".join(ignored),
            )
        if wanted == recorded:
            return
        for row in rows:
            db.delete(row)
        db.flush()
        for model, sched in wanted.items():
            for start, price in sched:
                db.add(
                    orm.PriceRow(
                        model=model,
                        start=start,
                        held=None if price is None else str(price.held),
                        busy=None if price is None else str(price.busy),
                        currency=currency or min(currencies, default="USD"),
                    )
                )
        self._event(db, "prices-recorded", "system", data={"ignored": ignored})
