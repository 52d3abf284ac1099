"""The operator's endpoints: ``/healthz`` (liveness), ``/readyz`` (readiness), ``/metrics`` and
``/api/quarantine``, and the 503 answer of any route whose store call failed.

Triggered by probes and scrapes. Reads the store (a write probe, paused credentials, quarantined rows),
the background workers' problems and the metrics registry (:mod:`relay.metrics`); writes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hmac
from typing import Protocol

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from relay.metrics import Metrics
from relay.settings import Settings
from relay.store import Store, StoreRefused, StoreUnavailable
from relay.web.app_parts import app_parts

__all__ = ["router", "store_refused_handler", "store_unavailable_handler"]


class _Workers(Protocol):
    def problems(self) -> list[str]: ...


class HealthParts(Protocol):
    """What these routes read of the app's parts (:class:`relay.assembly.RelayParts` has them)."""

    settings: Settings
    store: Store
    metrics: Metrics
    results: _Workers


def parts_of(request: Request) -> HealthParts:
    return app_parts(request)


router = APIRouter(tags=["observability"])


def is_operator(request: Request) -> bool:
    """Whether the caller may see the relay's internals (database URL, SQL, worker errors): always when
    ``RELAY_METRICS_TOKEN`` is unset, else only with ``Authorization: Bearer <token>``."""
    token = parts_of(request).settings.metrics_token
    if token is None:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode())


_OUTSIDER_DETAIL = "details need 'Authorization: Bearer <RELAY_METRICS_TOKEN>'"


def _shown(request: Request, detail: str) -> str:
    return detail if is_operator(request) else _OUTSIDER_DETAIL


def store_unavailable_handler(request: Request, exc: StoreUnavailable) -> JSONResponse:
    """Any route (the dashboard's included) whose store call failed or ran past the deadline: 503, not 500."""
    return JSONResponse({"error": "store_unavailable", "detail": _shown(request, str(exc))}, status_code=503)


def store_refused_handler(_request: Request, exc: StoreRefused) -> JSONResponse:
    """Any route whose value the database refused (a field longer than its column, out of range): the
    caller's data is at fault and retrying cannot help, so 422 naming the field, never 503."""
    return JSONResponse({"error": "store_refused", "detail": str(exc)}, status_code=422)


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
        return JSONResponse({"status": "unavailable", "detail": _shown(request, str(exc))}, status_code=503)
    problems = parts_of(request).results.problems()
    if problems:
        return JSONResponse({"status": "worker_failing", "detail": _shown(request, "; ".join(problems))}, status_code=503)
    try:
        paused = [g for g in parts_of(request).store.credential_gates() if g.paused]
    except StoreUnavailable as exc:
        return JSONResponse({"status": "unavailable", "detail": _shown(request, str(exc))}, status_code=503)
    if paused:
        detail = "; ".join(f"GitHub refused credential {g.credential} ({g.reason}); its dispatches wait" for g in paused)
        return JSONResponse({"status": "credential_paused", "detail": _shown(request, detail)}, status_code=503)
    return JSONResponse({"status": "ok"})


class QuarantinedEntry(BaseModel):
    worker: str = Field(description="the pass that set the row aside: run_rows (the run of a sent dispatch), time_outs or re-runs")
    subject: str = Field(description="the row, e.g. 'dispatch 17', 'run 5', 'delivery <id>'")
    error: str = Field(description="the error handling it raised")
    quarantined_at: dt.datetime


@router.get("/api/quarantine", response_model=list[QuarantinedEntry])
def quarantined(request: Request, limit: int = Query(100, ge=1, le=1000)) -> list[QuarantinedEntry]:
    """Rows background passes could not handle, newest first: each is skipped until an operator fixes it.
    With ``RELAY_METRICS_TOKEN`` set, only for ``Authorization: Bearer <token>`` (errors hold internals)."""
    if not is_operator(request):
        return _token_needed("/api/quarantine")
    try:
        entries = parts_of(request).store.quarantined(limit)
    except StoreUnavailable as exc:
        return JSONResponse({"error": "store_unavailable", "detail": _shown(request, str(exc))}, status_code=503)
    return [QuarantinedEntry(**dataclasses.asdict(entry)) for entry in entries]


def _token_needed(path: str) -> JSONResponse:
    return JSONResponse({"error": "metrics_token", "detail": (
        f"{path} needs 'Authorization: Bearer <token>' with the token set in RELAY_METRICS_TOKEN")},
        status_code=401, headers={"WWW-Authenticate": "Bearer"})


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus metrics; with ``RELAY_METRICS_TOKEN`` set, only for ``Authorization: Bearer <token>``."""
    if not is_operator(request):
        return _token_needed("/metrics")
    return Response(generate_latest(parts_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)
