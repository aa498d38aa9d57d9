"""The reclaimer's Prometheus metrics, on their own registry.

jupyterhub-idle-culler has no metrics and says what it did in its log; the reclaimer does the
same (one line per round, and each action) and also counts it here, served on ``metrics_port``
when one is set, so an alert can fire when rounds keep failing or data keeps going stale.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class ReclaimerMetrics:
    """Rounds, decisions, actions by outcome, stale leases, hub/pool/server errors, backoff."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.rounds = Counter(
            "gpupool_reclaimer_rounds_total",
            "Rounds by result: ok, not_leader (another replica leads), hub_error, pool_error "
            "(nothing was observed or acted on)",
            ["result"],
            registry=r,
        )
        self.decisions = Counter(
            "gpupool_reclaimer_decisions_total",
            "The pool's decisions on the rounds' leases, by kind (none, stale, noticed, "
            "deferred, notice, cancel, act)",
            ["kind"],
            registry=r,
        )
        self.stale = Counter(
            "gpupool_reclaimer_stale_leases_total",
            "Leases a round could not judge (data missing or old): never acted on",
            registry=r,
        )
        self.stale_rounds = Counter(
            "gpupool_reclaimer_stale_rounds_total",
            "Rounds in which at least one lease was stale",
            registry=r,
        )
        self.acts = Counter(
            "gpupool_reclaimer_acts_total",
            "Actions carried out, by action (stop, shrink, release-gpu) and outcome (done, failed)",
            ["action", "outcome"],
            registry=r,
        )
        self.errors = Counter(
            "gpupool_reclaimer_errors_total",
            "Failed calls, by whom to: hub, pool, server (a user's server)",
            ["target"],
            registry=r,
        )
        self.hook_errors = Counter(
            "gpupool_reclaimer_hook_errors_total",
            "notify_hook calls that raised (logged; the reclaimer goes on)",
            registry=r,
        )
        self.leader = Gauge(
            "gpupool_reclaimer_leader", "1 while this replica holds the lead", registry=r
        )
        self.backoff = Gauge(
            "gpupool_reclaimer_backoff_seconds",
            "Seconds until the next round (above the interval while backing off)",
            registry=r,
        )
        self.duration = Histogram(
            "gpupool_reclaimer_round_duration_seconds",
            "Time a round took, observing and acting",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0 when absent): for the log line and tests."""
        return self.registry.get_sample_value(name, labels or None) or 0.0
