"""Budgets that hold: warnings at 80 % and 100 % of a unit-hour budget, once per period, and for
a quota with ``budget_action: stop`` a budget notice on each running lease when it is spent.

The rules are ``pool.quota``'s (``QuotaSpec.budget_level``); the notice is an enforced one
(kind ``budget``, action ``stop``): the reclaimer asks the lab to save everything at its deadline
and stops the server, or the service does it when no reclaimer runs (``enforce_notices``), and
the lease is released ``budget``. The warnings are audit events (``budget-warning``), so each
level is said once per period whichever replica leads; the service passes them to its
``notify_hook``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from .. import orm
from ..pool import commands as c
from ..pool.facts import PoolState
from ..pool.leases import LIVE_STATES
from ..pool.quota import PERIODS, period_start
from .apply import LazyFacts, decided
from .operate import OperateStore
from .read.budgets import BudgetWarningView, budget_warning_view
from .reclaim import noticed
from .rows import epoch


class BudgetStore(OperateStore):
    """The budget round of the leader's housekeeping."""

    def budget_round(self, warn_before: float = 600.0) -> list[BudgetWarningView]:
        """Warn each user and group whose budget use crossed 80 % or 100 % this period (once per
        level and period), and give the running leases of a spent ``stop`` budget a notice
        ending ``warn_before`` seconds from now (``pool.decide``). Returns the new warnings."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            since = min(period_start(now, period) for period in PERIODS)
            warned: list[tuple[str, str, int, float]] = []
            for data, at in db.execute(
                select(orm.EventRow.data, orm.EventRow.ts).where(
                    orm.EventRow.kind == "budget-warning", orm.EventRow.ts >= since
                )
            ):
                said = tuple((data or {}).get(k) for k in ("subject", "name", "level"))
                subject, name, level = said
                if isinstance(subject, str) and isinstance(name, str) and isinstance(level, int):
                    warned.append((subject, name, level, epoch(at)))
            book = alloc.quotas
            specs = [*book.users.values(), *book.groups.values(), book.default_user]
            rows: Sequence[orm.LeaseRow] = ()
            if any(s.budget is not None and s.budget_action == "stop" for s in specs):
                rows = db.scalars(  # the leases a spent budget may give a notice
                    select(orm.LeaseRow)
                    .where(orm.LeaseRow.state.in_(LIVE_STATES))
                    .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
                ).all()
            lazy = LazyFacts(self, db, alloc, rows)  # a released grant's targets go along
            state = PoolState(
                alloc, lazy, noticed=tuple(noticed(r) for r in rows), warned=tuple(warned)
            )
            outcome = decided(state, c.BudgetRound(warn_before), self._now_s())
            read = {**{r.id: r for r in rows}, **lazy.read}
            self._apply_effects(db, alloc, outcome.effects, "system", read)
            return [budget_warning_view(w) for w in outcome.answer]
