"""Prometheus metrics of the pool, on their own registry (``GET /services/<name>/metrics``)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..store import Store
from ..store.read.gauges import PoolGaugesView
from ..store.read.headroom import HeadroomView

#: The label of usage without a group (a lease charged to no group).
NO_GROUP = "(none)"


class PoolMetrics:
    """Capacity, use, queue, grants/releases, request latency, and per group the month's
    unit-hours, cost and idle share (``usage_refresh``: seconds between recounts of those, so
    a scrape every few seconds does not read the month's leases every time)."""

    def __init__(self, usage_refresh: float = 60.0) -> None:
        self.registry = CollectorRegistry()
        self.usage_refresh = usage_refresh
        self._usage_at: float | None = None
        r = self.registry
        self.group_held = Gauge(
            "gpupool_group_held_unit_hours",
            "GPU unit-hours held this calendar month (UTC), per group",
            ["group"],
            registry=r,
        )
        self.group_busy = Gauge(
            "gpupool_group_busy_unit_hours",
            "GPU unit-hours busy this calendar month (UTC), per group",
            ["group"],
            registry=r,
        )
        self.group_idle_share = Gauge(
            "gpupool_group_idle_share",
            "Share of this month's held GPU time that was idle (0-1), per group",
            ["group"],
            registry=r,
        )
        self.group_cost = Gauge(
            "gpupool_group_cost",
            "Cost of this calendar month's GPU use so far at the pool config's prices, per group",
            ["group", "currency"],
            registry=r,
        )
        self.group_units = Gauge(
            "gpupool_group_held_units", "GPU units held now, per group", ["group"], registry=r
        )
        self.capacity = Gauge(
            "gpupool_capacity_units", "GPU units in the pool", ["model"], registry=r
        )
        self.free = Gauge("gpupool_free_units", "Free GPU units", ["model"], registry=r)
        self.used = Gauge("gpupool_used_units", "Held GPU units", ["model"], registry=r)
        self.offer_available = Gauge(
            "gpupool_offer_available", "Grants of an offer that fit now", ["offer"], registry=r
        )
        self.queue_length = Gauge("gpupool_queue_length", "Requests waiting", ["offer"], registry=r)
        self.headroom_free = Gauge(
            "gpupool_headroom_free_units",
            "Free GPU units the headroom counts (borrowing.keep_free): free units of schedulable"
            " hardware less those of a node held for a waiter that outranks notebooks",
            ["model"],
            registry=r,
        )
        self.headroom_keep = Gauge(
            "gpupool_headroom_keep_free_units",
            "GPU units kept free of borrowing by preemptible classes (0: none)",
            ["model"],
            registry=r,
        )
        self.held_node = Gauge(
            "gpupool_held_node",
            "1 per node held for a long waiter (its request and offer); out_of_count 1: its"
            " free units are out of the headroom's count",
            ["node", "request", "offer", "out_of_count"],
            registry=r,
        )
        self.node_unreachable = Gauge(
            "gpupool_node_unreachable",
            "1 while the node's agent is silent (no new grants there)",
            ["node"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "gpupool_queue_wait_seconds",
            "Time from queued to granted",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400),
            registry=r,
        )
        self.grants = Counter("gpupool_grants_total", "Leases granted", ["offer"], registry=r)
        self.releases = Counter("gpupool_releases_total", "Leases released", ["reason"], registry=r)
        self.mig_actions = Counter(
            "gpupool_mig_actions_total",
            "Dynamic-MIG actions nodes reported, by outcome (ok or the NVML error)",
            ["op", "result"],
            registry=r,
        )
        self.reclaim_notices = Counter(
            "gpupool_reclaim_notices_total",
            "Reclaim notices given, by what for (idle, cpu, max_age, borrowed)",
            ["kind"],
            registry=r,
        )
        self.reclaim_acts = Counter(
            "gpupool_reclaim_acts_total",
            "Reclaim actions claimed by a round, by action",
            ["action"],
            registry=r,
        )
        self.reclaim_cancels = Counter(
            "gpupool_reclaim_cancels_total",
            "Reclaim notices withdrawn (the lease works again, or the user kept it)",
            ["why"],
            registry=r,
        )
        self.reclaim_outcomes = Counter(
            "gpupool_reclaim_outcomes_total",
            "Reclaim actions the reclaimer finished, by result (done, failed)",
            ["result"],
            registry=r,
        )
        self.reclaiming = Gauge(
            "gpupool_leases_reclaiming", "Leases under a reclaim notice now", registry=r
        )
        self.requests = Histogram(
            "gpupool_request_duration_seconds",
            "API request latency",
            ["method", "route", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        #: (method, route, status) → the histogram's child (few: the routes, their statuses)
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._alert_metrics(r)

        self.write_batch_calls = Histogram(
            "gpupool_write_batch_calls",
            "State changes the writer applied together, per batch (group commit: one "
            "transaction for a run of allocate/release/keepalive calls)",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.write_batch_seconds = Histogram(
            "gpupool_write_batch_seconds",
            "Seconds the writer spent on one batch, from handing it to the store to its answers",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )

    def _alert_metrics(self, r: CollectorRegistry) -> None:
        """What the alert rules (``files/alerts.rules.yaml`` of the chart) need beyond the
        rest: counters without labels start at 0, so the first failure shows in increase()."""
        self.gpu_unhealthy = Gauge(
            "gpupool_gpu_unhealthy",
            "1 while the node reports the GPU unhealthy (lost, uncorrected ECC errors)",
            ["node", "gpu"],
            registry=r,
        )
        self.store_up = Gauge(
            "gpupool_store_up",
            "1 while the pool database answers this replica, 0 while it does not",
            registry=r,
        )
        self.queue_oldest = Gauge(
            "gpupool_queue_oldest_wait_seconds",
            "Seconds the oldest request waiting for the offer has waited (0: nobody waits)",
            ["offer"],
            registry=r,
        )
        self.group_idle_day = Gauge(
            "gpupool_group_idle_unit_hours_24h",
            "GPU unit-hours held but idle within the last 24 hours, per group",
            ["group"],
            registry=r,
        )
        self.budget_used = Gauge(
            "gpupool_budget_used_ratio",
            "Share of its unit-hour budget a quota used this period (user:<name>, group:<name>)",
            ["quota"],
            registry=r,
        )
        self.mig_failures = Counter(
            "gpupool_mig_failures_total",
            "Failed MIG re-partitions and dynamic-MIG actions (audit events mig-failed)",
            registry=r,
        )
        self.api_requests = Counter(
            "gpupool_api_requests", "API requests answered (any status)", registry=r
        )
        self.api_errors = Counter(
            "gpupool_api_server_errors", "API requests answered with a 5xx status", registry=r
        )
        for result in ("done", "failed"):  # exported at 0 before the first outcome
            self.reclaim_outcomes.labels(result=result)
        #: plain counts for the service's own alert evaluation (``service/alerts.py``)
        self.requests_seen = 0
        self.errors_seen = 0

    def observe_batch(self, calls: int, seconds: float) -> None:
        """Writer hook (its thread): one batch of ``calls`` applied in ``seconds``."""
        self.write_batch_calls.observe(calls)
        self.write_batch_seconds.observe(seconds)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        """Store listener: count grants and releases as they commit."""
        if kind == "granted":
            self.grants.labels(offer=data.get("offer", "")).inc()
            if data.get("waited") is not None:
                self.queue_wait.observe(data["waited"])
        elif kind == "released":
            self.releases.labels(reason=data.get("reason", "")).inc()
        elif kind == "reclaim-notice":
            self.reclaim_notices.labels(kind=data.get("kind") or "").inc()
        elif kind == "reclaim-acting":
            self.reclaim_acts.labels(action=data.get("action") or "").inc()
        elif kind in ("reclaim-cancelled", "reclaim-extended"):
            self.reclaim_cancels.labels(why="kept" if kind == "reclaim-extended" else "used").inc()
        elif kind in ("reclaimed", "reclaim-failed"):
            self.reclaim_outcomes.labels(result="done" if kind == "reclaimed" else "failed").inc()
        elif kind in ("mig-created", "mig-destroyed"):
            op = "create" if kind == "mig-created" else "destroy"
            self.mig_actions.labels(op=op, result="ok").inc()
        elif kind == "mig-failed":
            self.mig_actions.labels(op=data.get("op", ""), result=data.get("error") or "").inc()
            self.mig_failures.inc()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Record one API request."""
        key = (method, route, status)
        child = self._request_children.get(key)
        if child is None:  # labels() validates and locks each time: a few % of a request
            child = self._request_children[key] = self.requests.labels(
                method=method, route=route, status=str(status)
            )
        child.observe(seconds)
        self.requests_seen += 1
        self.api_requests.inc()
        if status >= 500:
            self.errors_seen += 1
            self.api_errors.inc()

    def render(self, store: Store) -> bytes:
        """Refresh the gauges from the pool and render the exposition text. With the database
        unreachable only ``gpupool_store_up`` changes (to 0); the rest keeps its last values."""
        try:
            store.ping()
        except Exception:
            self.store_up.set(0)
            return generate_latest(self.registry)
        self.store_up.set(1)
        view = store.pool_gauges(fresh=False)
        for m in view.capacity:
            self.capacity.labels(model=m.model).set(m.gpus)
            self.free.labels(model=m.model).set(m.free_units)
            self.used.labels(model=m.model).set(m.gpus - m.free_units)
        for offer, n in view.waiting:
            self.queue_length.labels(offer=offer).set(n)
        for offer, n in view.available:
            self.offer_available.labels(offer=offer).set(n)
        for node, unreachable in view.unreachable:
            self.node_unreachable.labels(node=node).set(int(unreachable))
        self._render_alert_facts(view)
        self._render_headroom(store.headroom(fresh=False))
        self.reclaiming.set(store.reclaiming_count())
        self._render_groups(store, view)
        return generate_latest(self.registry)

    def _render_headroom(self, view: HeadroomView) -> None:
        """The headroom's gauges (``Store.headroom``): per model, and the held nodes."""
        for m in view.models:
            self.headroom_free.labels(model=m.model).set(m.free_units)
            self.headroom_keep.labels(model=m.model).set(m.keep_free)
        self.held_node.clear()
        for x in view.held:
            out = str(int(x.out_of_count))
            self.held_node.labels(
                node=x.node, request=x.request, offer=x.offer, out_of_count=out
            ).set(1)

    def _render_alert_facts(self, view: PoolGaugesView) -> None:
        """The gauges of the alert rules the pool state answers (``pool.alerts.pool_facts``)."""
        facts = view.facts
        self.gpu_unhealthy.clear()
        for g in view.gpus:
            self.gpu_unhealthy.labels(node=g.node, gpu=g.gpu).set(int(not g.healthy))
        for offer in view.offers:
            self.queue_oldest.labels(offer=offer).set(facts.oldest_wait.get(offer, 0.0))
        self.budget_used.clear()
        for quota, share in facts.budget_used.items():
            self.budget_used.labels(quota=quota).set(share)

    def _render_groups(self, store: Store, view: PoolGaugesView) -> None:
        """The per-group gauges: units held now (``view``), and the month so far (recounted
        at most every ``usage_refresh`` seconds; a new month starts from nothing)."""
        held: dict[str, float] = {}
        for group, units in view.group_units:
            held[group or NO_GROUP] = held.get(group or NO_GROUP, 0.0) + units
        self.group_units.clear()
        for group, units in held.items():
            self.group_units.labels(group=group).set(units)
        tick = time.monotonic()
        if self._usage_at is not None and tick - self._usage_at < self.usage_refresh:
            return
        self._usage_at = tick
        now = store.clock()
        month = datetime(now.year, now.month, 1)
        if now <= month:
            return
        report = store.usage_report(month, now, "group")
        self.group_idle_day.clear()
        for group, hours in idle_day_hours(store, now).items():
            self.group_idle_day.labels(group=group).set(hours)
        for gauge in (self.group_held, self.group_busy, self.group_idle_share, self.group_cost):
            gauge.clear()
        for row in report.items:
            group = NO_GROUP if row.kind == "no-group" else row.key
            figures = row.figures
            self.group_held.labels(group=group).set(float(figures.held))
            self.group_busy.labels(group=group).set(float(figures.busy))
            self.group_idle_share.labels(group=group).set(figures.idle_share)
            self.group_cost.labels(group=group, currency=report.currency).set(float(figures.cost))


def idle_day_hours(store: Store, now: datetime) -> dict[str, float]:
    """Held-but-idle unit-hours per group (``NO_GROUP`` for none) within the 24 hours before
    ``now``: held minus busy, as the usage report counts them."""
    report = store.usage_report(now - timedelta(days=1), now, "group")
    return {
        (row.key or NO_GROUP): max(0.0, float(row.figures.held) - float(row.figures.busy))
        for row in report.items
    }
