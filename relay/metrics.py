"""The relay's Prometheus metrics: counters and histograms that intake and the dispatcher update, and
the outbox's depth, quarantined rows and paused credentials read from the store at scrape time.

Each app has its own registry (:class:`Metrics`), so several apps in one process (tests) never share
counters; ``/metrics`` (:mod:`relay.web.health`) serves it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from relay.store import Store, StoreUnavailable

__all__ = ["Metrics"]


class _OutboxDepth:
    """Queue depth per state, quarantined rows and paused credentials, read from the store at scrape
    time (so every process reports the shared state)."""

    def __init__(self, store: Store):
        self._store = store

    def collect(self):
        family = GaugeMetricFamily("relay_outbox_dispatches", "dispatches in the outbox by state", labels=["state"])
        try:
            depth = self._store.outbox_depth()
        except StoreUnavailable:
            return
        for state, count in depth.items():
            family.add_metric([state], count)
        yield family
        quarantined = GaugeMetricFamily(
            "relay_quarantined_rows", "rows a background pass set aside (see /api/quarantine), by worker", labels=["worker"],
        )
        try:
            counts = self._store.quarantine_counts()
        except StoreUnavailable:
            return
        for worker, count in sorted(counts.items()):
            quarantined.add_metric([worker], count)
        yield quarantined
        paused = GaugeMetricFamily(
            "relay_credential_paused", "1 while GitHub refused the credential (401) and its dispatches wait", labels=["credential"],
        )
        try:
            gates = self._store.credential_gates()
        except StoreUnavailable:
            return
        for gate in gates:
            paused.add_metric([gate.credential], 1.0 if gate.paused else 0.0)
        yield paused


class Metrics:
    """The relay's metrics, in a registry of their own."""

    def __init__(self, store: Store | None = None):
        self.registry = CollectorRegistry()
        self.events = Counter(
            "relay_webhook_events", "webhooks received, by event and outcome", ["event", "outcome"], registry=self.registry
        )
        self.dispatch_seconds = Histogram(
            "relay_dispatch_request_seconds", "duration of one repository_dispatch call", ["outcome"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry,
        )
        self.dispatch_delay = Histogram(
            "relay_dispatch_delay_seconds", "time from webhook accepted to dispatch sent",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600), registry=self.registry,
        )
        self.sent = Counter("relay_dispatches_sent", "dispatches delivered (204)", registry=self.registry)
        self.claims = Counter(
            "relay_dispatch_claims", "outbox claims by the dispatcher loop, by result (rows or empty)", ["result"],
            registry=self.registry,
        )
        self.retries = Counter("relay_dispatch_retries", "dispatches rescheduled, by reason", ["reason"], registry=self.registry)
        self.failures = Counter("relay_dispatch_failures", "dispatches given up, by reason", ["reason"], registry=self.registry)
        if store is not None:
            self.registry.register(_OutboxDepth(store))
