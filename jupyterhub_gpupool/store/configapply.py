"""The one applier's part for the pool config's load (``pool.rules.config``): the file's offer
and quota rows, the prices recorded over time, the audit event, and the allocator dropped to
be rebuilt from the rows. A declared node's rows are written by ``AdminStore._declare_node``
(``NodeDeclared``). ``store/apply.py``'s ``_apply_effects`` calls these, in the
effects' order, in the command's transaction."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.effects import (
    AllocatorRebuilt,
    ConfigLoaded,
    FileQuotaLoaded,
    OfferDropped,
    OfferLoaded,
    PricesLoaded,
)
from ..pool.pricing import Prices, reconcile
from .core import StoreCore
from .rows import offer_spec, schedules, set_quota

log = logging.getLogger(__name__)

#: The effects this part applies (``ConfigApplier._config_changed``).
CONFIG_EFFECTS = (
    OfferLoaded,
    OfferDropped,
    FileQuotaLoaded,
    PricesLoaded,
    ConfigLoaded,
    AllocatorRebuilt,
)


class ConfigApplier(StoreCore):
    """Writes a config load's effects into rows."""

    def _config_changed(
        self,
        db: Session,
        effect: OfferLoaded
        | OfferDropped
        | FileQuotaLoaded
        | PricesLoaded
        | ConfigLoaded
        | AllocatorRebuilt,
    ) -> None:
        if isinstance(effect, OfferLoaded):
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
        elif isinstance(effect, ConfigLoaded):
            data = {"offers": effect.offers, "nodes": effect.nodes}
            self._event(db, "config-loaded", "system", data=data)
            db.flush()
        else:  # AllocatorRebuilt: offers, quotas or nodes changed
            self._allocator = None

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
