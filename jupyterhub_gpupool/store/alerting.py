"""What the service's own alert evaluation reads and writes: whether the database answers,
how many audit events of some kinds happened lately, and the audit events of alerts raised
and resolved (``alert-raised``, ``alert-resolved``; the alerts themselves live in memory)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text

from .. import orm
from .read.gauges import AlertFactsView, PoolGaugesView, alert_facts_view, pool_gauges_view
from .rows import epoch
from .views import ViewStore

#: Audit kinds of the alerts' transitions.
ALERT_EVENTS = ("alert-raised", "alert-resolved")


class AlertStore(ViewStore):
    """Reads and the one write of the alert loop (``service/alerts.py``)."""

    def ping(self) -> None:
        """Raise unless the database answers a ``SELECT 1`` now."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def alert_facts(self, now: float, *, fresh: bool = False) -> AlertFactsView:
        """The pool state's facts the alert rules decide on at ``now`` (epoch seconds;
        ``read.gauges``). ``fresh=False``: a round may be ``view_lag`` behind (``locked``)."""
        with self.locked(fresh=fresh) as alloc:
            return alert_facts_view(alloc, now)

    def pool_gauges(self, *, fresh: bool = False) -> PoolGaugesView:
        """What the metrics scrape sets from the pool state, by the store's clock, in one
        locked call (``read.gauges``). ``fresh=False``: a scrape may be ``view_lag`` behind
        rather than rebuild the allocator after every batch of decisions (``locked``)."""
        now = epoch(self.clock())
        with self.locked(fresh=fresh) as alloc:
            return pool_gauges_view(alloc, now)

    def count_events(self, kinds: Iterable[str], since: datetime) -> int:
        """Audit events of ``kinds`` at or after ``since``."""
        with self.read() as db:
            count = db.scalar(
                select(func.count())
                .select_from(orm.EventRow)
                .where(orm.EventRow.kind.in_(list(kinds)), orm.EventRow.ts >= since)
            )
            return count or 0  # COUNT always answers one row

    def record_alerts(self, changes: list[Mapping[str, Any]], *, actor: str = "") -> int:
        """Audit alert transitions: each ``{"event": "alert-raised"|"alert-resolved", "at":
        datetime, ...the alert}``, written in order in one short transaction. Returns how
        many were written."""
        with self.writing() as db:
            for change in changes:
                event = change["event"]
                if event not in ALERT_EVENTS:
                    raise ValueError(f"not an alert event: {event!r}")
                data = {k: v for k, v in change.items() if k not in ("event", "at")}
                db.add(
                    orm.EventRow(ts=change["at"], actor=actor or "system", kind=event, data=data)
                )
        return len(changes)
