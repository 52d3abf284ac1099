"""``POST /github/callback``: where a downstream run reports its state and its report; ``GET`` of the
same URL publishes the limits a callback must fit (no credential: they are not secret), so a client can
shorten a report before it sends it (``conformance callback`` does).

Triggered by a backend repository's workflow (``.github/workflows/conformance.yml``): once with
``state: in_progress`` when the run starts, once with ``state: completed``, a ``conclusion`` and the
conformance JSON report when it ends. Checks the content type, the declared size, the caller's
credentials (:mod:`relay.results.oidc`) and its rate, reads the body within its cap, and hands both to
the receiver (:mod:`relay.results.receiver`), which stores the update and wakes reporting.

Checks, in order, each with its own answer (JSON ``{"error": code, "detail": sentence}``):

====  =========================================================================================
415   the body is not ``application/json``
413   the body exceeds ``RELAY_CALLBACK_MAX_BYTES``, or the report carries more than
      ``RELAY_CALLBACK_MAX_TESTS`` tests, a test message over ``RELAY_CALLBACK_MAX_MESSAGE_CHARS``
      or a test id over 1000 characters (the detail gives the numbers)
401   no valid OIDC token or static token (:mod:`relay.results.oidc`)
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

import logging
import math
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from relay.results.oidc import AuthError, Caller
from relay.results.receiver import CallbackAccepted, CallbackBody, CallbackRejected, CallbackService
from relay.settings import Settings
from relay.store import StoreUnavailable
from relay.web.app_parts import app_parts
from relay.web.request_body import BodyRefused, drain, read_capped

__all__ = ["rejection_handler", "router"]

log = logging.getLogger("relay.callbacks")


class CallbackParts(Protocol):
    """What the callback route reads of the app's parts (:class:`relay.assembly.RelayParts` has them)."""

    settings: Settings
    callbacks: CallbackService


def parts_of(request: Request) -> CallbackParts:
    return app_parts(request)


def rejection_handler(_request: Request, exc: CallbackRejected) -> JSONResponse:
    return JSONResponse({"error": exc.error, "detail": exc.detail}, status_code=exc.status, headers=exc.headers)


def _service(request: Request) -> CallbackService:
    return parts_of(request).results.callbacks


async def verified_caller(request: Request) -> Caller:
    """Dependency: content type, declared size, then credentials; the handler never sees an unverified caller."""
    service = _service(request)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise CallbackRejected(415, "unsupported_media_type", f"Content-Type {content_type or 'missing'!r}; send application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > service.max_body_bytes:
        await drain(request)  # so a client still sending reads this 413 instead of a reset connection
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


class CallbackLimits(BaseModel):
    """What a callback must fit: its body in bytes, its report's test count, one test's message length."""

    max_bytes: int
    max_tests: int
    max_message_chars: int


@router.get("/github/callback", response_model=CallbackLimits,
            summary="the limits a callback must fit (RELAY_CALLBACK_MAX_BYTES, _MAX_TESTS, _MAX_MESSAGE_CHARS)")
def callback_limits(request: Request) -> CallbackLimits:
    service = _service(request)
    return CallbackLimits(max_bytes=service.max_body_bytes, max_tests=service.report_limits.max_tests,
                          max_message_chars=service.report_limits.max_message_chars)


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
