"""Alerts: which conditions of the pool an operator must hear about, and when each is raised
and resolved. Pure: no I/O, no clock of its own.

The same alerts ship as Prometheus rules (the chart's ``files/alerts.rules.yaml``, which a
test keeps equal to :data:`RULES` in names, severities and pending times); this module is
what the pool service evaluates itself for installs without Prometheus.

* :func:`pool_facts` reads what the pool state says (unhealthy GPUs, silent nodes, the queue,
  budgets) from an :class:`~jupyterhub_gpupool.pool.allocator.Allocator`;
* :func:`conditions` turns :class:`Facts` and :class:`Thresholds` into the conditions that
  hold now, one per ``(kind, subject)``;
* :func:`step` follows Prometheus' ``for:``: a condition holds ``for_s`` seconds before its
  alert is raised (once), and the alert is resolved (once) the first round it no longer holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: Severities, most urgent first (Alertmanager's usual names).
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class AlertRule:
    """One alert: its Prometheus name, severity, pending time and the admin page of its
    cause (relative to the panel's ``admin/``)."""

    kind: str
    name: str
    severity: str
    for_s: float
    page: str
    summary: str


#: Every alert the pool raises, by kind (the ``kind`` of the notify payload).
RULES: dict[str, AlertRule] = {
    r.kind: r
    for r in (
        AlertRule(
            "gpu_unhealthy",
            "GPUPoolGPUUnhealthy",
            "critical",
            0,
            "nodes",
            "GPU {subject} is unhealthy or lost",
        ),
        AlertRule(
            "node_unreachable",
            "GPUPoolNodeUnreachable",
            "warning",
            60,
            "nodes",
            "The agent of node {subject} is unreachable",
        ),
        AlertRule(
            "mig_failed",
            "GPUPoolMigRepartitionFailed",
            "warning",
            0,
            "audit?kind=mig-failed",
            "A MIG re-partition or dynamic-MIG action failed",
        ),
        AlertRule(
            "store_unavailable",
            "GPUPoolStoreUnavailable",
            "critical",
            60,
            "",
            "The pool database is unavailable",
        ),
        AlertRule(
            "queue_stalled",
            "GPUPoolQueueStalled",
            "warning",
            0,
            "leases",
            "The oldest request for offer {subject} has waited too long",
        ),
        AlertRule(
            "offer_exhausted",
            "GPUPoolOfferExhausted",
            "warning",
            900,
            "leases",
            "Offer {subject} has nothing free while requests wait",
        ),
        AlertRule(
            "idle_gpu_hours",
            "GPUPoolIdleGPUHours",
            "info",
            0,
            "usage",
            "Group {subject} held GPUs idle for many unit-hours in the last day",
        ),
        AlertRule(
            "budget_80",
            "GPUPoolBudgetNearlySpent",
            "info",
            0,
            "quotas",
            "Budget of {subject} is 80 % spent",
        ),
        AlertRule(
            "budget_100",
            "GPUPoolBudgetSpent",
            "warning",
            0,
            "quotas",
            "Budget of {subject} is spent",
        ),
        AlertRule(
            "reclaim_failing",
            "GPUPoolReclaimFailing",
            "warning",
            0,
            "audit?kind=reclaim-failed",
            "Reclaim actions are failing",
        ),
        AlertRule(
            "server_errors",
            "GPUPoolServerErrors",
            "warning",
            300,
            "",
            "The pool service answers many requests with a server error (5xx)",
        ),
    )
}


@dataclass(frozen=True)
class Thresholds:
    """The thresholds of the conditions (the service's ``PoolAlerts`` settings)."""

    #: seconds the oldest waiter of an offer may wait
    queue_wait: float = 1800.0
    #: held-but-idle unit-hours per group over the last 24 hours
    idle_unit_hours: float = 24.0
    #: share of a budget at which the first alert is raised
    budget_warn: float = 0.8
    #: failed reclaim actions within the last hour
    reclaim_failures: int = 3
    #: share of API requests answered 5xx over the last 5 minutes ...
    error_ratio: float = 0.05
    #: ... counted only with at least this many requests in those 5 minutes
    min_requests: int = 20


@dataclass
class Facts:
    """What the conditions are decided on (gathered by the service from the store)."""

    store_up: bool = True
    #: ``node/gpu-uuid`` of every GPU reported unhealthy (lost GPUs included)
    unhealthy_gpus: list[str] = field(default_factory=list)
    unreachable_nodes: list[str] = field(default_factory=list)
    #: failed MIG actions and re-partitions within the last hour
    mig_failures: int = 0
    #: offer → seconds its oldest waiter has waited
    oldest_wait: dict[str, float] = field(default_factory=dict)
    #: offers with nothing available and someone waiting
    exhausted: list[str] = field(default_factory=list)
    #: group → held-but-idle unit-hours within the last 24 hours
    idle_hours: dict[str, float] = field(default_factory=dict)
    #: ``user:<name>`` / ``group:<name>`` → share of its budget used this period
    budget_used: dict[str, float] = field(default_factory=dict)
    #: failed reclaim actions within the last hour
    reclaim_failures: int = 0
    #: API requests and 5xx answers within the last 5 minutes
    requests: int = 0
    errors: int = 0


@dataclass(frozen=True)
class Condition:
    """A condition that holds now."""

    kind: str
    subject: str
    value: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)


@dataclass(frozen=True)
class Alert:
    """A condition being followed: pending until ``for_s`` has passed, then firing."""

    kind: str
    subject: str
    severity: str
    summary: str
    since: float
    firing: bool = False
    value: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)

    @property
    def name(self) -> str:
        return RULES[self.kind].name

    def to_json(self) -> dict[str, Any]:
        """The alert as the API and the notify hook carry it (``since``: epoch seconds)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "severity": self.severity,
            "subject": self.subject,
            "summary": self.summary,
            "since": self.since,
            "value": self.value,
            "page": RULES[self.kind].page,
        }


def pool_facts(alloc: Any, now: float) -> Facts:
    """The facts the pool state holds (``alloc``: an ``Allocator``; ``now``: epoch seconds).

    Budgets: the share used of every user and group quota with a unit-hour budget that has
    used anything this period (the allocator's ``quotas.used_hours``)."""
    facts = Facts()
    for node in alloc.nodes.values():
        if node.unreachable:
            facts.unreachable_nodes.append(node.name)
        facts.unhealthy_gpus += [f"{node.name}/{g.uuid}" for g in node.gpus if not g.healthy]
    waiting: dict[str, int] = {}
    for w in alloc.waiters.values():
        offer = w.request.offer
        waiting[offer] = waiting.get(offer, 0) + 1
        facts.oldest_wait[offer] = max(facts.oldest_wait.get(offer, 0.0), now - w.since)
    for name, n in waiting.items():
        offer = alloc.offers.get(name)
        if n and offer is not None and alloc.available(offer, cap=1) == 0:
            facts.exhausted.append(name)
    book = alloc.quotas
    for key, used in book.used_hours.items():
        if key.startswith("group:"):
            spec = book.groups.get(key[len("group:") :])
        else:
            spec = book.user_spec(key)
            key = f"user:{key}"
        if spec is not None and spec.budget:
            facts.budget_used[key] = used / float(spec.budget)
    return facts


def conditions(facts: Facts, t: Thresholds) -> list[Condition]:
    """The conditions that hold given ``facts``."""
    if not facts.store_up:  # nothing else is known without the database
        return [Condition("store_unavailable", "pool")]
    found = [Condition("gpu_unhealthy", s) for s in facts.unhealthy_gpus]
    found += [Condition("node_unreachable", n) for n in facts.unreachable_nodes]
    if facts.mig_failures > 0:
        found.append(Condition("mig_failed", "pool", facts.mig_failures))
    found += [
        Condition("queue_stalled", offer, waited)
        for offer, waited in facts.oldest_wait.items()
        if waited > t.queue_wait
    ]
    found += [Condition("offer_exhausted", offer) for offer in facts.exhausted]
    found += [
        Condition("idle_gpu_hours", group, hours)
        for group, hours in facts.idle_hours.items()
        if hours > t.idle_unit_hours
    ]
    for quota, share in facts.budget_used.items():
        if share >= 1:
            found.append(Condition("budget_100", quota, share))
        elif share >= t.budget_warn:
            found.append(Condition("budget_80", quota, share))
    if facts.reclaim_failures >= t.reclaim_failures:
        found.append(Condition("reclaim_failing", "pool", facts.reclaim_failures))
    if facts.requests >= t.min_requests and facts.errors > t.error_ratio * facts.requests:
        found.append(Condition("server_errors", "pool", facts.errors / facts.requests))
    return found


@dataclass(frozen=True)
class Step:
    """What a round changed: the alerts followed now, those raised and those resolved."""

    alerts: dict[tuple[str, str], Alert]
    raised: list[Alert]
    resolved: list[Alert]


def step(
    alerts: Mapping[tuple[str, str], Alert],
    holding: Iterable[Condition],
    now: float,
    rules: Mapping[str, AlertRule] = RULES,
) -> Step:
    """One evaluation round at ``now``: a new condition starts pending (``since`` = now) and is
    raised once it has held ``for_s``; a firing alert whose condition no longer holds is
    resolved; a pending one that stops holding is forgotten (never raised, never resolved)."""
    followed: dict[tuple[str, str], Alert] = {}
    raised: list[Alert] = []
    for c in holding:
        rule = rules[c.kind]
        alert = alerts.get(c.key) or Alert(
            c.kind, c.subject, rule.severity, rule.summary.format(subject=c.subject), now
        )
        alert = replace(alert, value=c.value)
        if not alert.firing and now - alert.since >= rule.for_s:
            alert = replace(alert, firing=True)
            raised.append(alert)
        followed[c.key] = alert
    resolved = [a for k, a in alerts.items() if a.firing and k not in followed]
    return Step(followed, raised, resolved)
