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

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from .. import orm
from ..pool.leases import LIVE_STATES
from ..pool.quota import QuotaSpec, period_start
from .operate import OperateStore
from .rows import ts


class BudgetStore(OperateStore):
    """The budget round of the leader's housekeeping."""

    def budget_round(self, warn_before: float = 600.0) -> list[dict[str, Any]]:
        """Warn each user and group whose budget use crossed 80 % or 100 % this period (once per
        level and period), and give the running leases of a spent ``stop`` budget a notice
        ending ``warn_before`` seconds from now. Returns the new warnings."""
        now = self.clock()
        out: list[dict[str, Any]] = []
        with self.transaction() as (db, alloc):
            book = alloc.quotas
            subjects: list[tuple[str, str, QuotaSpec, float]] = []
            users = {le.request.user for le in alloc.leases.values()} | set(book.users)
            for user in sorted(users):
                spec = book.user_spec(user)
                subjects.append(("user", user, spec, book.used_hours.get(user, 0.0)))
            for group, spec in sorted(book.groups.items()):
                subjects.append(("group", group, spec, book.used_hours.get(f"group:{group}", 0.0)))
            for kind, name, spec, used in subjects:
                level = spec.budget_level(used)
                if level is None:
                    continue
                start = period_start(now, spec.period)
                if not self._warned(db, kind, name, level, start):
                    warning = {
                        "subject": kind,
                        "name": name,
                        "level": level,
                        "used_unit_hours": round(used, 6),
                        "budget": float(spec.budget or 0),
                        "period": spec.period,
                        "period_start": ts(start),
                        "action": spec.budget_action,
                    }
                    self._event(db, "budget-warning", "system", data=warning)
                    out.append(warning)
                if level == 100 and spec.budget_action == "stop":
                    self._stop_spent(db, alloc, kind, name, spec, now, warn_before)
        return out

    def _warned(self, db: Any, kind: str, name: str, level: int, start: datetime) -> bool:
        rows = db.scalars(
            select(orm.EventRow.data).where(
                orm.EventRow.kind == "budget-warning", orm.EventRow.ts >= start
            )
        )
        return any(
            (d or {}).get("subject") == kind
            and (d or {}).get("name") == name
            and (d or {}).get("level") == level
            for d in rows
        )

    def _stop_spent(
        self,
        db: Any,
        alloc: Any,
        kind: str,
        name: str,
        spec: QuotaSpec,
        now: datetime,
        warn_before: float,
    ) -> None:
        """A budget notice on each running lease charged to the spent budget (once)."""
        column = orm.LeaseRow.user if kind == "user" else orm.LeaseRow.group
        rows = db.scalars(
            select(orm.LeaseRow).where(column == name, orm.LeaseRow.state.in_(LIVE_STATES))
        ).all()
        why = (
            f"the {float(spec.budget or 0):g} unit-hour budget of this {spec.period} "
            f"({kind} {name}) is spent: the server is stopped (your work is saved first)"
        )
        deadline = now + timedelta(seconds=warn_before)
        for row in rows:
            if row.state in ("queued", "awaiting_approval") or row.reclaim_kind == "budget":
                continue
            self._admin_notice(db, alloc, row, "budget", deadline, "stop", why, "system")
