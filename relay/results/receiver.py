"""The callback receiver: a verified caller's callback checked, its run moved on, its report stored.

Called by ``POST /github/callback`` (:mod:`relay.results.routes`) with a caller that route verified
(:mod:`relay.results.oidc`) and the body it read. Reads the dispatch the nonce names and the run record;
writes the run's state, times, per-test results and whether the report's torch is the dispatched commit
(:mod:`conformance.provenance`), in one transaction through :mod:`relay.store`, then says the run changed
(``on_run_changed``: reporting looks). Every refusal is a :class:`CallbackRejected` with its status, code
and a sentence saying what to fix (the table is in :mod:`relay.results.routes`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conformance.report import ReportValidationError, validate_report

from relay.web.json_input import JsonRefused, load_json
from relay.results import fixed_entries
from relay.results.oidc import Caller, CallerAuth
from relay.store.run_states import CONCLUSIONS, RunState, TransitionRefused, state_for_conclusion
from relay.store.results_operations import CallbackUpdate
from relay.store.per_test_results import NewTestResult

if TYPE_CHECKING:
    from relay.store import Store

__all__ = ["CallbackAccepted", "CallbackBody", "CallbackRejected", "CallbackService", "RateLimiter", "ReportLimits"]

log = logging.getLogger("relay.callbacks")


BIG_CALLBACK_BYTES = 1 << 20  # a callback this big is a report of thousands of tests
BIG_CALLBACKS_AT_ONCE = 1
# Then 503 with Retry-After, well within the callback client's 30 s per request (it sends the callback
# again, within its 300 s of retries): a wait past its timeout would have it send a copy while the first
# is still being stored.
BIG_CALLBACK_WAIT_SECONDS = 10.0
BIG_CALLBACK_RETRY_AFTER = 5


class CallbackRejected(Exception):
    """A refused callback: HTTP status, a short error code, a sentence saying what to fix."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


class CallbackBody(BaseModel):
    """What a downstream run sends (the ``report`` is checked separately, against the published schema)."""

    model_config = ConfigDict(extra="forbid")

    nonce: str = Field(min_length=16, max_length=128, description="client_payload.nonce of the dispatch")
    state: Literal["in_progress", "completed"]
    # Strict: a boolean, a string or a float is refused, not read as a number.
    run_id: int = Field(ge=1, le=2**63 - 1, strict=True, description="github.run_id of the downstream run")
    run_attempt: int = Field(1, ge=1, le=10_000, strict=True, description="github.run_attempt")
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
    """Everything the callback endpoint needs (``ResultsSide.callbacks``)."""

    store: Store
    auth: CallerAuth
    limiter: RateLimiter
    max_body_bytes: int
    report_limits: ReportLimits = dataclasses.field(default_factory=ReportLimits)
    on_run_changed: Callable[[int], None] | None = None  # wakes reporting, after the transaction commits
    max_attempts: int = 10  # RELAY_CALLBACK_MAX_ATTEMPTS
    # Big callbacks are handled one at a time: parsing, validating and storing one is seconds of Python
    # holding the GIL, and eight at once left a webhook 9-11 s behind them (bench/intake_under_reports.py).
    big_callbacks: threading.BoundedSemaphore = dataclasses.field(
        default_factory=lambda: threading.BoundedSemaphore(BIG_CALLBACKS_AT_ONCE))
    big_callback_wait_seconds: float = BIG_CALLBACK_WAIT_SECONDS

    def process(self, caller: Caller, body: bytes) -> CallbackAccepted:
        if len(body) < BIG_CALLBACK_BYTES:
            return self._process(caller, body)
        if not self.big_callbacks.acquire(timeout=self.big_callback_wait_seconds):
            raise CallbackRejected(
                503, "busy", f"another callback of over {BIG_CALLBACK_BYTES >> 20} MiB is being stored; send this one "
                f"again in {BIG_CALLBACK_RETRY_AFTER} s", headers={"Retry-After": str(BIG_CALLBACK_RETRY_AFTER)})
        try:
            return self._process(caller, body)
        finally:
            self.big_callbacks.release()

    def _process(self, caller: Caller, body: bytes) -> CallbackAccepted:
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
        update = dataclasses.replace(self._update(caller, callback, target.dispatch_id), max_attempts=self.max_attempts)
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
                "fixed": fixed_entries.summarize(report),  # known failures it found fixed (its unexpected passes)
            }
            tests = [NewTestResult(t.nodeid, t.suite, t.outcome, t.duration, t.message) for t in report.tests]
            torch_version, torch_git_version = report.torch.version, report.torch.git_version
        return CallbackUpdate(
            target=state_for_conclusion(callback.conclusion), conclusion=callback.conclusion, summary=summary,
            torch_version=torch_version, torch_git_version=torch_git_version, tests=tests or (),
            reason=callback.message, **common,
        )
