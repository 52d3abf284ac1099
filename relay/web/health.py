"""Observability: structured logs, Prometheus metrics, and the ``/healthz`` (liveness), ``/readyz``
(readiness) and ``/metrics`` routes.

Triggered at start-up (``configure_logging``), by intake and the dispatcher (they count through
:class:`Metrics`) and by scrapes. Reads the store for health and queue depth; writes log lines to
stderr (one JSON object per line by default). Each app has its own metrics registry, so several apps in
one process (tests) never share counters.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hmac
import json
import logging
import sys
import time

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, Field

from relay.parts import parts_of
from relay.store import Store, StoreUnavailable

__all__ = ["Metrics", "configure_logging", "router"]

_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("relay")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


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


router = APIRouter(tags=["observability"])


def store_unavailable_handler(_request: Request, exc: StoreUnavailable) -> JSONResponse:
    """Any route (the dashboard's included) whose store call failed or ran past the deadline: 503, not 500."""
    return JSONResponse({"error": "store_unavailable", "detail": str(exc)}, status_code=503)


@router.get("/healthz")
def healthz() -> JSONResponse:
    """Liveness: 200 whenever the process answers HTTP. It asks nothing of the store or the workers, so
    an orchestrator's liveness probe never restarts a relay for an outage a restart cannot cure (a
    frozen database, a refused credential); those show on ``/readyz``."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when the store can be written within its deadline, no background worker keeps
    failing and no credential is paused; 503 naming the problem otherwise."""
    try:
        parts_of(request).store.probe()
    except StoreUnavailable as exc:
        return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
    problems = parts_of(request).results.problems()
    if problems:
        return JSONResponse({"status": "worker_failing", "detail": "; ".join(problems)}, status_code=503)
    try:
        paused = [g for g in parts_of(request).store.credential_gates() if g.paused]
    except StoreUnavailable as exc:
        return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
    if paused:
        detail = "; ".join(f"GitHub refused credential {g.credential} ({g.reason}); its dispatches wait" for g in paused)
        return JSONResponse({"status": "credential_paused", "detail": detail}, status_code=503)
    return JSONResponse({"status": "ok"})


class QuarantinedEntry(BaseModel):
    worker: str = Field(description="the pass that set the row aside: run_rows (the run of a sent dispatch), time_outs or re-runs")
    subject: str = Field(description="the row, e.g. 'dispatch 17', 'run 5', 'delivery <id>'")
    error: str = Field(description="the error handling it raised")
    quarantined_at: dt.datetime


@router.get("/api/quarantine", response_model=list[QuarantinedEntry])
def quarantined(request: Request, limit: int = Query(100, ge=1, le=1000)) -> list[QuarantinedEntry]:
    """Rows background passes could not handle, newest first: each is skipped until an operator fixes it."""
    try:
        entries = parts_of(request).store.quarantined(limit)
    except StoreUnavailable as exc:
        return JSONResponse({"error": "store_unavailable", "detail": str(exc)}, status_code=503)
    return [QuarantinedEntry(**dataclasses.asdict(entry)) for entry in entries]


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus metrics; with ``RELAY_METRICS_TOKEN`` set, only for ``Authorization: Bearer <token>``."""
    token = parts_of(request).settings.metrics_token
    if token is not None:
        given = request.headers.get("authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return JSONResponse({"error": "metrics_token", "detail": (
                "/metrics needs 'Authorization: Bearer <token>' with the token set in RELAY_METRICS_TOKEN")},
                status_code=401, headers={"WWW-Authenticate": "Bearer"})
    return Response(generate_latest(parts_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)
