"""What the metrics scrape and the alert rules read of the pool state, as one view each: the
pool's facts the alert rules decide on (``pool.alerts.pool_facts``), and the gauges the scrape
sets from the allocator (capacity per model, queue and availability per offer, nodes' and GPUs'
health, units held per group). The service sets the gauges and builds the alerts' ``Facts``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ...pool.alerts import pool_facts
from ...pool.allocator import Allocator

__all__ = [
    "AlertFactsView",
    "GpuHealthView",
    "ModelCapacityView",
    "PoolGaugesView",
    "alert_facts_view",
    "pool_gauges_view",
]

#: How many grants of an offer the availability gauge counts up to.
AVAILABLE_CAP = 50


@dataclass(frozen=True)
class AlertFactsView:
    """The alert rules' facts of the pool state: ``node/uuid`` of unhealthy GPUs and the
    unreachable nodes (pool order), per offer its oldest waiter's wait in seconds, the offers
    with someone waiting and nothing available, and per budgeted quota (``user:``/``group:``)
    the share of its budget used this period."""

    unhealthy_gpus: tuple[str, ...]
    unreachable_nodes: tuple[str, ...]
    oldest_wait: Mapping[str, float]
    exhausted: tuple[str, ...]
    budget_used: Mapping[str, float]


@dataclass(frozen=True)
class ModelCapacityView:
    """A GPU model: how many GPUs, and their free units (0 on unschedulable nodes)."""

    model: str
    gpus: int
    free_units: float


class GpuHealthView(NamedTuple):
    """A GPU of a node and whether it is healthy. Immutable like the other views; a named
    tuple because every scrape builds one per GPU of the pool, three times faster than a
    frozen dataclass."""

    node: str
    gpu: str
    healthy: bool


@dataclass(frozen=True)
class PoolGaugesView:
    """The scrape's figures, in the allocator's order (the exposition lists label sets in the
    order they were first set): per model its capacity; the configured offers; per offer
    (every configured one, then any other a waiter names) how many wait; per configured offer
    how many grants fit (at most ``AVAILABLE_CAP``); per node whether it is unreachable; every
    GPU's health; units held per group (``""``: leases of no group); and the alert facts
    (oldest wait, budgets)."""

    capacity: tuple[ModelCapacityView, ...]
    offers: tuple[str, ...]
    waiting: tuple[tuple[str, int], ...]
    available: tuple[tuple[str, int], ...]
    unreachable: tuple[tuple[str, bool], ...]
    gpus: tuple[GpuHealthView, ...]
    group_units: tuple[tuple[str, float], ...]
    facts: AlertFactsView


def alert_facts_view(alloc: Allocator, now: float) -> AlertFactsView:
    """The facts of ``alloc`` at ``now`` (epoch seconds, as the alert rules count)."""
    f = pool_facts(alloc, now)
    return AlertFactsView(
        tuple(f.unhealthy_gpus),
        tuple(f.unreachable_nodes),
        f.oldest_wait,
        tuple(f.exhausted),
        f.budget_used,
    )


def pool_gauges_view(alloc: Allocator, now: float) -> PoolGaugesView:
    """The gauges of ``alloc`` at ``now`` (epoch seconds)."""
    capacity = tuple(
        ModelCapacityView(model, m["gpus"], m["free_units"])
        for model, m in alloc.capacity_by_model().items()
    )
    waiting: dict[str, int] = dict.fromkeys(alloc.offers, 0)
    for w in alloc.waiters.values():
        waiting[w.request.offer] = waiting.get(w.request.offer, 0) + 1
    available = tuple(
        (spec.name, alloc.available(spec, cap=AVAILABLE_CAP)) for spec in alloc.offers.values()
    )
    nodes = alloc.nodes.values()
    held: dict[str, float] = {}
    for lease in alloc.leases.values():
        key = lease.group or ""
        held[key] = held.get(key, 0.0) + float(lease.units)
    return PoolGaugesView(
        capacity,
        tuple(alloc.offers),
        tuple(waiting.items()),
        available,
        tuple((n.name, bool(n.unreachable)) for n in nodes),
        tuple(GpuHealthView(n.name, g.uuid, g.healthy) for n in nodes for g in n.gpus),
        tuple(held.items()),
        alert_facts_view(alloc, now),
    )
