"""Result callbacks: ``POST /github/callback``, where a downstream run reports its state and its report.

Triggered by a backend repository's workflow (``.github/workflows/conformance.yml``): once with
``state: in_progress`` when the run starts, once with ``state: completed``, a ``conclusion`` and the
conformance JSON report when it ends. Reads the caller's credentials (:mod:`relay.oidc`), the
dispatch the nonce names, and the run record; writes the run's state, times, per-test results and
whether the report's torch is the dispatched commit (:mod:`relay.provenance`) (one transaction, through :mod:`relay.store`), then hands the run to reporting (:mod:`relay.reporting`).

Checks, in order, each with its own answer (JSON ``{"error": code, "detail": sentence}``):

====  =========================================================================================
415   the body is not ``application/json``
413   the body exceeds ``RELAY_CALLBACK_MAX_BYTES``, or the report carries more than
      ``RELAY_CALLBACK_MAX_TESTS`` tests, a test message over ``RELAY_CALLBACK_MAX_MESSAGE_CHARS``
      or a test id over 1000 characters (the detail gives the numbers)
401   no valid OIDC token or static token (:mod:`relay.oidc`)
403   the caller is not an allowlisted backend at L2+, or the nonce belongs to another backend's
      dispatch, or the OIDC token names another run than the body
429   the caller's repository exceeded ``RELAY_CALLBACK_RATE_PER_MINUTE`` (``Retry-After`` says when)
400   malformed JSON (also: nested deeper than 64 levels), a string that is not valid Unicode
      (``invalid_unicode``, naming its field), a body that does not follow the callback schema, or a
      report that does not follow the published report schema (the message names the first problem)
404   unknown nonce
410   expired nonce (older than ``RELAY_NONCE_TTL_HOURS``)
409   the run state machine refuses: a replay, ``completed`` before ``in_progress``, a second
      ``completed``, or a callback for a run already timed out or cancelled; or the nonce is already
      bound to another downstream run (``nonce_bound_to_other_run``: a nonce binds one run, and only
      later attempts of that run are new runs; an earlier attempt is ``attempt_not_later``)
200   accepted: the run's new state, queue and execution time
====  =========================================================================================
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conformance.report import ReportValidationError, validate_report

from relay.web.json_input import JsonRefused, load_json
from relay.results.oidc import AuthError, Caller, CallerAuth
from relay.parts import parts_of
from relay.web.request_body import BodyRefused, read_capped
from relay.run_states import CONCLUSIONS, RunState, TransitionRefused, state_for_conclusion
from relay.store import StoreUnavailable
from relay.store.results_operations import CallbackUpdate
from relay.store.per_test_results import NewTestResult

if TYPE_CHECKING:
    from relay.store import Store

__all__ = [
    "CallbackBody", "CallbackRejected", "CallbackService", "RateLimiter", "ReportLimits", "rejection_handler", "router",
]

log = logging.getLogger("relay.callbacks")


class CallbackRejected(Exception):
    """A refused callback: HTTP status, a short error code, a sentence saying what to fix."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


def rejection_handler(_request: Request, exc: CallbackRejected) -> JSONResponse:
    return JSONResponse({"error": exc.error, "detail": exc.detail}, status_code=exc.status, headers=exc.headers)


class CallbackBody(BaseModel):
    """What a downstream run sends (the ``report`` is checked separately, against the published schema)."""

    model_config = ConfigDict(extra="forbid")

    nonce: str = Field(min_length=16, max_length=128, description="client_payload.nonce of the dispatch")
    state: Literal["in_progress", "completed"]
    run_id: int = Field(ge=1, le=2**63 - 1, description="github.run_id of the downstream run")
    run_attempt: int = Field(1, ge=1, le=10_000, description="github.run_attempt")
    run_url: str | None = Field(None, max_length=2000, pattern=r"^https?://", description="the run's page")
    conclusion: Literal[CONCLUSIONS] | None = Field(None, description="required with state completed")
    report: dict[str, Any] | None = Field(None, description="the conformance JSON report (completed only)")
    message: str | None = Field(
        None, max_length=1000, description="completed only: why there is no report (missing, truncated, off-schema)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> "CallbackBody":
        if self.state == "completed" and self.conclusion is None:
            raise ValueError("state 'completed' needs a 'conclusion' (success, failure, cancelled, timed_out, ...)")
        if self.state == "in_progress" and (self.conclusion, self.report, self.message) != (None, None, None):
            raise ValueError(
                "state 'in_progress' carries no 'conclusion', 'report' or 'message'; send them with 'completed'",
            )
        return self


class CallbackAccepted(BaseModel):
    run: int = Field(description="the relay's id of the run (dashboard: /runs/{run})")
    backend: str
    state: str
    previous_state: str
    conclusion: str | None
    queue_seconds: float | None
    execution_seconds: float | None
    tests_recorded: int


class RateLimiter:
    """A token bucket per key (the caller's repository): ``per_minute`` sustained, ``burst`` at once."""

    def __init__(self, per_minute: float, burst: int, clock=time.monotonic):
        self._rate = per_minute / 60.0
        self._burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """0 when allowed (one token taken), else the seconds until a token is available."""
        if self._rate <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(key, (self._burst, now))
            tokens = min(self._burst, tokens + (now - at) * self._rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self._rate


@dataclasses.dataclass(frozen=True)
class ReportLimits:
    """How big a report may be; checked on the raw JSON before the (costly) schema validation."""

    max_tests: int = 20_000
    max_message_chars: int = 16_384
    max_nodeid_chars: int = 1000

    def check(self, report: Any) -> None:
        """Raise a 413 CallbackRejected giving the numbers when ``report`` is over a limit."""
        tests = report.get("tests") if isinstance(report, dict) else None
        if not isinstance(tests, list):
            return  # the schema validation names what is wrong
        if len(tests) > self.max_tests:
            raise CallbackRejected(
                413, "report_too_large",
                f"the report carries {len(tests)} tests; at most {self.max_tests} are accepted per report "
                "(RELAY_CALLBACK_MAX_TESTS); split the run or raise the limit",
            )
        for index, test in enumerate(tests):
            if not isinstance(test, dict):
                continue
            for field, limit, setting in (("message", self.max_message_chars, "RELAY_CALLBACK_MAX_MESSAGE_CHARS"),
                                          ("nodeid", self.max_nodeid_chars, None), ("suite", self.max_nodeid_chars, None)):
                value = test.get(field)
                if isinstance(value, str) and len(value) > limit:
                    where = f" ({setting})" if setting else ""
                    raise CallbackRejected(
                        413, "report_too_large",
                        f"report tests/{index}/{field} is {len(value)} characters; at most {limit} are accepted{where}",
                    )


@dataclasses.dataclass
class CallbackService:
    """Everything the callback endpoint needs (``RelayParts.callbacks``)."""

    store: Store
    auth: CallerAuth
    limiter: RateLimiter
    max_body_bytes: int
    report_limits: ReportLimits = dataclasses.field(default_factory=ReportLimits)
    on_run_changed: Callable[[int], None] | None = None  # wakes reporting, after the transaction commits

    def process(self, caller: Caller, body: bytes) -> CallbackAccepted:
        try:
            data = load_json(body)
        except JsonRefused as exc:
            raise CallbackRejected(400, "malformed_json" if exc.code == "invalid_json" else exc.code, exc.detail) from None
        try:
            callback = CallbackBody.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<body>"
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise CallbackRejected(
                400, "invalid_callback", f"callback body invalid at {where}: {first['msg']}{more}",
            ) from None
        if caller.method == "oidc":
            for what, issued, named in (("run", caller.run_id, callback.run_id),
                                        ("attempt", caller.run_attempt, callback.run_attempt)):
                if issued is not None and issued != named:
                    raise CallbackRejected(
                        403, "run_mismatch", f"the OIDC token was issued to {what} {issued}, but the body names {what} {named}",
                    )
        target = self.store.find_nonce(callback.nonce)
        if target is None:
            raise CallbackRejected(404, "unknown_nonce", "the nonce matches no dispatch; quote client_payload.nonce as received")
        if target.backend != caller.backend:
            raise CallbackRejected(
                403, "nonce_of_other_backend",
                f"the nonce belongs to a dispatch to backend {target.backend!r}, but the caller is {caller.backend!r}",
            )
        if target.expired_at is not None:
            raise CallbackRejected(
                410, "nonce_expired", f"the nonce of dispatch {target.dispatch_id} (delivery {target.delivery_id}) has expired",
            )
        self.report_limits.check(callback.report)
        update = self._update(caller, callback, target.dispatch_id)
        try:
            applied = self.store.apply_callback(update)
        except TransitionRefused as exc:
            raise CallbackRejected(409, exc.code, exc.message) from None
        run = applied.run
        log.info("callback accepted", extra={
            "backend": run.backend, "run": run.id, "run_id": run.run_id, "attempt": run.run_attempt,
            "state": run.state, "previous": applied.previous_state, "delivery": run.delivery_id,
        })
        if applied.superseded:
            log.info("runs superseded", extra={"backend": run.backend, "run": run.id, "superseded": applied.superseded})
        if self.on_run_changed is not None:
            for changed in (run.id, *applied.superseded):
                try:
                    self.on_run_changed(changed)
                except Exception:  # reporting must never fail an accepted callback
                    log.exception("could not hand run %s to reporting", changed)
        return CallbackAccepted(
            run=run.id, backend=run.backend, state=run.state, previous_state=applied.previous_state,
            conclusion=run.conclusion, queue_seconds=run.queue_seconds, execution_seconds=run.execution_seconds,
            tests_recorded=applied.tests_recorded,
        )

    @staticmethod
    def _update(caller: Caller, callback: CallbackBody, dispatch_id: int) -> CallbackUpdate:
        common = dict(dispatch_id=dispatch_id, run_id=callback.run_id, run_attempt=callback.run_attempt,
                      run_url=callback.run_url)
        if callback.state == "in_progress":
            return CallbackUpdate(target=RunState.in_progress, **common)
        summary = tests = torch_version = torch_git_version = None
        if callback.report is not None:
            try:
                report = validate_report(callback.report)
            except ReportValidationError as exc:
                raise CallbackRejected(400, "invalid_report", f"{exc}; see schemas/report.schema.json") from None
            if report.backend.name != caller.backend:
                raise CallbackRejected(
                    400, "report_backend_mismatch",
                    f"the report is for backend {report.backend.name!r}, but the caller is {caller.backend!r}",
                )
            summary = {
                "counts": report.summary.model_dump(),
                "suites": {suite: counts.model_dump() for suite, counts in report.suites().items()},
                "world_size": report.backend.world_size,
                "torch_git_version": report.torch.git_version,
            }
            tests = [NewTestResult(t.nodeid, t.suite, t.outcome, t.duration, t.message) for t in report.tests]
            torch_version, torch_git_version = report.torch.version, report.torch.git_version
        return CallbackUpdate(
            target=state_for_conclusion(callback.conclusion), conclusion=callback.conclusion, summary=summary,
            torch_version=torch_version, torch_git_version=torch_git_version, tests=tests or (),
            reason=callback.message, **common,
        )


def _service(request: Request) -> CallbackService:
    return parts_of(request).callbacks


async def verified_caller(request: Request) -> Caller:
    """Dependency: content type, declared size, then credentials; the handler never sees an unverified caller."""
    service = _service(request)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise CallbackRejected(415, "unsupported_media_type", f"Content-Type {content_type or 'missing'!r}; send application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > service.max_body_bytes:
        raise CallbackRejected(
            413, "payload_too_large",
            f"body of {declared} bytes exceeds the limit of {service.max_body_bytes} bytes (RELAY_CALLBACK_MAX_BYTES)",
        )
    try:
        caller = await run_in_threadpool(service.auth.authenticate, request.headers.get("authorization"))
    except AuthError as exc:
        raise CallbackRejected(exc.status, exc.code, exc.message) from None
    wait = service.limiter.take(caller.repository.lower())
    if wait > 0:
        raise CallbackRejected(
            429, "rate_limited",
            f"too many callbacks from {caller.repository}; retry in {math.ceil(wait)} s (RELAY_CALLBACK_RATE_PER_MINUTE)",
            headers={"Retry-After": str(math.ceil(wait))},
        )
    return caller


router = APIRouter(tags=["callbacks"])

_ERRORS = {
    code: {"description": text, "content": {"application/json": {"example": {"error": "...", "detail": "..."}}}}
    for code, text in {
        400: "malformed body or report", 401: "no valid credentials", 403: "caller not allowed",
        404: "unknown nonce", 409: "refused by the run state machine", 410: "expired nonce",
        413: "body too large", 415: "not JSON", 429: "rate limited", 503: "store unavailable",
    }.items()
}


@router.post(
    "/github/callback",
    response_model=CallbackAccepted,
    responses=_ERRORS,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": CallbackBody.model_json_schema(ref_template="#/components/schemas/{model}")}}}},
    summary="a downstream run reports in_progress, then completed with its report",
)
async def callback(request: Request, caller: Annotated[Caller, Depends(verified_caller)]) -> CallbackAccepted:
    service = _service(request)
    try:
        body = await read_capped(request, service.max_body_bytes, "RELAY_CALLBACK_MAX_BYTES",
                                 timeout=parts_of(request).settings.body_read_timeout_seconds)
    except BodyRefused as refused:
        raise CallbackRejected(refused.status, refused.code, refused.detail) from None
    try:
        return await run_in_threadpool(service.process, caller, body)
    except StoreUnavailable as exc:
        log.error("store unavailable during a callback", extra={"error": str(exc)})
        raise CallbackRejected(503, "store_unavailable", "the relay cannot store results right now; retry later") from None
