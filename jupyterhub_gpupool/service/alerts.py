"""The pool's alerts without Prometheus: the service evaluates the conditions of
``pool/alerts.py`` itself, on the leading replica, every ``PoolAlerts.interval`` seconds.

Each alert is raised once (after its condition held its pending time) and resolved once (the
first round it no longer holds): both go to the ``notify_hook`` (event ``alert`` or
``alert-resolved``, for admins) and to the audit log (``alert-raised``, ``alert-resolved``,
through the writer). The alerts in force live in memory; the admin panel shows them as a
banner and ``GET api/v1/alerts`` lists them. The database being unreachable is checked on
every replica (a replica cannot tell whether it leads without it); what could not be audited
then is audited once the database answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from traitlets import Bool, Float, Integer
from traitlets.config import Configurable

from ..pool import commands
from ..pool.alerts import (
    SEVERITIES,
    Alert,
    Condition,
    Facts,
    Step,
    Thresholds,
    conditions,
    step,
)
from ..pool.commands import Command
from ..store import Store
from ..timeparse import format_epoch
from .metrics import PoolMetrics, idle_day_hours
from .notify import Notifier

#: Seconds of API request counts the 5xx share is taken over.
ERROR_WINDOW = 300.0


class PoolAlerts(Configurable):
    """The alerts the pool service raises itself (the same conditions as the shipped
    Prometheus rules; see the docs' alert reference)."""

    enabled = Bool(
        True,
        help="Evaluate the alerts in the service (notify_hook, audit log, admin panel banner, "
        "GET api/v1/alerts). Installs that alert through Prometheus may turn it off.",
    ).tag(config=True)
    interval = Float(
        30.0, min=1.0, help="Seconds between evaluations of the alert conditions."
    ).tag(config=True)
    queue_wait = Float(
        1800.0,
        help="GPUPoolQueueStalled: seconds the oldest request for an offer may wait.",
    ).tag(config=True)
    idle_unit_hours = Float(
        24.0,
        help="GPUPoolIdleGPUHours: GPU unit-hours a group may hold idle within 24 hours.",
    ).tag(config=True)
    budget_warn = Float(
        0.8,
        min=0.0,
        max=1.0,
        help="GPUPoolBudgetNearlySpent: share of a unit-hour budget used that raises the "
        "first budget alert (GPUPoolBudgetSpent follows at the whole budget).",
    ).tag(config=True)
    reclaim_failures = Integer(
        3, min=1, help="GPUPoolReclaimFailing: failed reclaim actions within an hour."
    ).tag(config=True)
    error_ratio = Float(
        0.05,
        min=0.0,
        max=1.0,
        help="GPUPoolServerErrors: share of API requests answered with a 5xx status within "
        "5 minutes (on this replica).",
    ).tag(config=True)
    min_requests = Integer(
        20,
        min=1,
        help="GPUPoolServerErrors: requests within the 5 minutes below which the share is not "
        "judged.",
    ).tag(config=True)

    def thresholds(self) -> Thresholds:
        """These settings as the pure rules take them."""
        return Thresholds(
            queue_wait=self.queue_wait,
            idle_unit_hours=self.idle_unit_hours,
            budget_warn=self.budget_warn,
            reclaim_failures=self.reclaim_failures,
            error_ratio=self.error_ratio,
            min_requests=self.min_requests,
        )


class AlertMonitor:
    """Follows the alert conditions round by round; keeps those in force."""

    def __init__(
        self,
        store: Store,
        write: Callable[[Command], Awaitable[Any]],
        notify: Notifier,
        metrics: PoolMetrics,
        thresholds: Thresholds,
        *,
        leader: Callable[[], bool] = lambda: True,
        actor: str = "",
        log: logging.Logger | None = None,
    ) -> None:
        self.store, self.write, self.notify, self.metrics = store, write, notify, metrics
        self.thresholds = thresholds
        self.leader = leader
        self.actor = actor
        self.log = log or logging.getLogger("jupyterhub_gpupool.alerts")
        #: (kind, subject) → the alert followed (pending or firing)
        self.alerts: dict[tuple[str, str], Alert] = {}
        #: audit events not written yet (the database was away)
        self.unwritten: list[Mapping[str, Any]] = []
        #: (time, requests, 5xx) seen, for the 5xx share over ``ERROR_WINDOW``
        self._counts: deque[tuple[float, int, int]] = deque()
        self.rounds = 0

    def now(self) -> float:
        """The store's clock (injectable in tests) in epoch seconds."""
        return self.store.clock().replace(tzinfo=timezone.utc).timestamp()

    def active(self) -> list[dict[str, Any]]:
        """The firing alerts, most severe first, then oldest first."""
        firing = [a for a in self.alerts.values() if a.firing]
        firing.sort(key=lambda a: (SEVERITIES.index(a.severity), a.since, a.kind, a.subject))
        return [{**a.to_json(), "since": format_epoch(a.since)} for a in firing]

    def gather(self, now: float) -> Facts:
        """What the conditions are decided on now, on the leading replica (blocking reads:
        run off the event loop)."""
        pool = self.store.alert_facts(now, fresh=False)
        facts = Facts(
            unhealthy_gpus=list(pool.unhealthy_gpus),
            unreachable_nodes=list(pool.unreachable_nodes),
            oldest_wait=dict(pool.oldest_wait),
            exhausted=list(pool.exhausted),
            budget_used=dict(pool.budget_used),
        )
        at = datetime.fromtimestamp(now, timezone.utc).replace(tzinfo=None)
        hour_ago = at - timedelta(hours=1)
        facts.mig_failures = self.store.count_events(["mig-failed"], hour_ago)
        facts.reclaim_failures = self.store.count_events(["reclaim-failed"], hour_ago)
        facts.idle_hours = idle_day_hours(self.store, at)
        facts.requests, facts.errors = self._error_counts(now)
        return facts

    def _error_counts(self, now: float) -> tuple[int, int]:
        """Requests and 5xx answers of this replica within the last ``ERROR_WINDOW``."""
        seen = (now, self.metrics.requests_seen, self.metrics.errors_seen)
        self._counts.append(seen)
        while len(self._counts) > 1 and now - self._counts[1][0] >= ERROR_WINDOW:
            self._counts.popleft()
        _, requests, errors = self._counts[0]
        return seen[1] - requests, seen[2] - errors

    async def round(self) -> Step:
        """One evaluation: raise and resolve, notify and audit what changed. Without the
        database only its own alert is judged; a replica that does not lead keeps nothing in
        force (the leader raises the alerts)."""
        now = self.now()
        loop = asyncio.get_running_loop()
        facts: Facts | None = Facts(store_up=False)
        try:
            await loop.run_in_executor(None, self.store.ping)
        except Exception as e:
            self.log.warning("Alerts: the pool database does not answer: %s", e)
        else:  # the leader lock's connection is used on the event loop only (as housekeeping)
            facts = await loop.run_in_executor(None, self.gather, now) if self.leader() else None
        holding = [] if facts is None else conditions(facts, self.thresholds)
        if facts is not None and not facts.store_up:  # nothing else can be judged: unchanged
            holding += [
                Condition(a.kind, a.subject, a.value)
                for a in self.alerts.values()
                if a.kind != "store_unavailable"
            ]
        result = step(self.alerts, holding, now)
        self.alerts = result.alerts
        self.rounds += 1
        for alert in result.raised:
            self._tell("alert", alert, now)
        for alert in result.resolved:
            self._tell("alert-resolved", alert, now)
        if facts is None or facts.store_up:
            await self._audit()
        return result

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """A round every ``interval`` seconds until ``stop`` (a failed round is logged)."""
        while not stop.is_set():
            try:
                await self.round()
            except Exception:
                self.log.exception("Evaluating the alerts failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def _tell(self, event: str, alert: Alert, now: float) -> None:
        """Notify admins and queue the audit event of one transition."""
        payload = {**alert.to_json(), "since": format_epoch(alert.since)}
        if event == "alert-resolved":
            payload["resolved"] = format_epoch(now)
        level = logging.WARNING if event == "alert" else logging.INFO
        self.log.log(level, "Alert %s: %s (%s)", event, payload["summary"], alert.severity)
        self.notify(event, {}, **payload)
        audit = "alert-raised" if event == "alert" else "alert-resolved"
        at = datetime.fromtimestamp(now, timezone.utc).replace(tzinfo=None)
        self.unwritten.append({"event": audit, "at": at, **payload})

    async def _audit(self) -> None:
        """Write the audit events not written yet (kept for the next round on failure)."""
        if not self.unwritten:
            return
        batch, self.unwritten = self.unwritten, []
        try:
            await self.write(commands.RecordAlerts(batch, actor=self.actor))
        except Exception as e:
            self.unwritten = batch + self.unwritten
            self.log.warning("Alerts: could not audit %d alert events yet: %s", len(batch), e)
