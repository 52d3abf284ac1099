"""Intake: ``POST /github/webhook``: verify, normalise, deduplicate, store, then answer.

Triggered by GitHub for every upstream webhook. Reads the raw body and headers, the allowlist and the
settings; writes the delivery, its outbox rows and the PR's labels in one transaction (the store's
group commit: concurrent webhooks share one commit, and each is answered only once the commit holding
its rows is done), then wakes the dispatcher (or, for a re-run request, the re-run watcher). Nothing is
sent to GitHub here.

The :func:`verified_webhook` dependency runs before the handler, so no handler can forget it: body
size cap (413), then the signature in constant time against every configured secret (401), then the
other headers (400), content type (415) and JSON (400: not JSON, nested deeper than 64 levels, or a
string that is not valid Unicode). :func:`relay.intake.events.normalise` then checks every field the relay
keeps (types, integer ranges, lengths, 40-hex shas). Answers:

    200 {"status": "pong"}                         ping
    202 {"status": "queued", "dispatches": [...]}  stored; one outbox row per target backend
    202 {"status": "recorded", "reason": ...}      stored, nothing to send (e.g. a label no backend watches)
    202 {"status": "stored", ...}                  kept for the results side (issue_comment, check_run, check_suite)
    200 {"status": "duplicate"}                    this X-GitHub-Delivery, or this exact signed body under another
                                                   delivery id (a replay: the signature does not cover the
                                                   header), was already stored: nothing new
    200 {"status": "ignored", "reason": ...}       another repository, or an event/action the relay does not handle
    400 {"error": "invalid_payload"}              a field the relay keeps is missing or invalid (the detail names it),
                                                   or the trimmed body is over GitHub's limits
    422 {"error": "store_refused"}                 the database refused this webhook's rows (named); its batch neighbours are stored
    503 {"error": "store_unavailable"}             not stored within RELAY_STORE_DEADLINE_SECONDS: GitHub shows the failure; redeliver later
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from relay import trust
from relay.intake import events as events_mod
from relay.intake.events import PayloadError, UpstreamEvent
from relay.metrics import Metrics
from relay.settings import Settings
from relay.store import NewDelivery, NewDispatch, PullRequestSnapshot, Store, StoreRefused, StoreUnavailable
from relay.web.app_parts import app_parts
from relay.web.json_input import JsonRefused, load_json
from relay.web.request_body import BodyBudget, BodyRefused, read_capped

__all__ = ["SIGNATURE_HEADER", "Webhook", "WebhookRejected", "router", "signature_matches", "verified_webhook"]

log = logging.getLogger("relay.intake")


class _Wakes(Protocol):
    def wake(self) -> None: ...


class _Results(Protocol):
    def run_changed(self, run_pk: int | None = None) -> None: ...

    def rerun_requested(self) -> None: ...


class IntakeParts(Protocol):
    """What intake reads of the app's parts (:class:`relay.assembly.RelayParts` has them), per request."""

    settings: Settings
    secrets: list[bytes]
    body_budget: BodyBudget
    allowlist: list[trust.BackendTarget]
    store: Store
    metrics: Metrics
    dispatcher: _Wakes | None
    results: _Results


def parts_of(request: Request) -> IntakeParts:
    return app_parts(request)


SIGNATURE_HEADER = "X-Hub-Signature-256"
_SIGNATURE = re.compile(r"sha256=([0-9a-fA-F]{64})")
_DELIVERY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
_EVENT = re.compile(r"[a-z_]{1,64}")

FORWARDED_EVENTS = frozenset({"pull_request", "push"})
# Kept for the results side: re-run requests (check_run/check_suite "rerequested", PR comments).
STORED_EVENTS = frozenset({"issue_comment", "check_run", "check_suite"})


class WebhookRejected(Exception):
    """A refused webhook: HTTP status, a short error code and a sentence saying what to fix."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


@dataclasses.dataclass(frozen=True)
class Webhook:
    event: str
    delivery: str
    payload: dict[str, Any]
    body: bytes


def signature_matches(body: bytes, header: str, secrets_: list[bytes]) -> bool:
    """Whether ``header`` (``sha256=<hex>``) is the HMAC-SHA256 of ``body`` under any of ``secrets_``.

    Every secret is tried, each with ``hmac.compare_digest``, so the time taken does not reveal which
    secret (if any) matched or how many leading characters agree.
    """
    match = _SIGNATURE.fullmatch(header)
    if match is None:
        return False
    given = match.group(1).lower().encode()
    ok = False
    for secret in secrets_:
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
        ok |= hmac.compare_digest(expected, given)
    return ok


async def verified_webhook(request: Request) -> Webhook:
    """The signature is checked before any other header or the body is looked at."""
    parts = parts_of(request)
    settings = parts.settings
    try:
        body = await read_capped(request, settings.max_body_bytes, "RELAY_MAX_BODY_BYTES",
                                 budget=parts.body_budget, timeout=settings.body_read_timeout_seconds)
    except BodyRefused as refused:
        raise WebhookRejected(refused.status, refused.code, refused.detail, refused.headers) from None
    signature = request.headers.get(SIGNATURE_HEADER)
    if signature is None:
        raise WebhookRejected(401, "signature_missing", f"{SIGNATURE_HEADER} header is missing; configure a secret on the webhook")
    if _SIGNATURE.fullmatch(signature) is None:
        raise WebhookRejected(401, "signature_malformed", f"{SIGNATURE_HEADER} must be 'sha256=' followed by 64 hex digits")
    if not signature_matches(body, signature, parts.secrets):
        raise WebhookRejected(401, "signature_mismatch", "signature matches no configured webhook secret (RELAY_WEBHOOK_SECRETS)")
    event = request.headers.get("X-GitHub-Event")
    if not event or not _EVENT.fullmatch(event):
        raise WebhookRejected(400, "event_header", "X-GitHub-Event header is missing or malformed")
    delivery = request.headers.get("X-GitHub-Delivery")
    if not delivery or not _DELIVERY.fullmatch(delivery):
        raise WebhookRejected(400, "delivery_header", "X-GitHub-Delivery header is missing or not a delivery GUID")
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "application/json":
        raise WebhookRejected(
            415, "unsupported_media_type",
            f"content type {content_type or 'none'!r}; set the webhook's content type to application/json",
        )
    try:
        payload = load_json(body)
    except JsonRefused as exc:
        code = "invalid_payload" if exc.code == "invalid_unicode" else exc.code
        raise WebhookRejected(400, code, f"delivery {delivery}: {exc.detail}") from None
    if not isinstance(payload, dict):
        raise WebhookRejected(400, "invalid_json", "body must be a JSON object")
    return Webhook(event=event, delivery=delivery, payload=payload, body=body)


VerifiedWebhook = Annotated[Webhook, Depends(verified_webhook)]

router = APIRouter(tags=["intake"])


def _answer(request: Request, hook: Webhook, status: int, outcome: str, **fields: Any) -> JSONResponse:
    parts_of(request).metrics.events.labels(hook.event, outcome).inc()
    log.info("webhook", extra={"event": hook.event, "delivery": hook.delivery, "outcome": outcome,
                               **{k: v for k, v in fields.items() if k in ("reason", "dispatches")}})
    return JSONResponse({"status": outcome, "delivery": hook.delivery, **fields}, status_code=status)


def _invalid(request: Request, hook: Webhook, exc: PayloadError) -> JSONResponse:
    parts_of(request).metrics.events.labels(hook.event, "invalid").inc()
    return JSONResponse({"error": "invalid_payload", "detail": f"delivery {hook.delivery}: {exc}"}, status_code=400)


def _new_dispatches(event: UpstreamEvent, targets: list[trust.BackendTarget]) -> list[NewDispatch]:
    """One outbox row per target, each with its own nonce; raises PayloadError over GitHub's limits."""
    nonces = [secrets.token_urlsafe(24) for _ in targets]
    event_type = events_mod.event_type(event)
    return [
        NewDispatch(backend=target.name, repository=target.repository, event_type=event_type,
                    client_payload=body, nonce=nonce)
        for target, nonce, body in zip(targets, nonces, events_mod.client_payloads(event, nonces))
    ]


def _snapshot(event: UpstreamEvent) -> PullRequestSnapshot | None:
    pr = event.pull_request
    if pr is None:
        return None
    return PullRequestSnapshot(
        repository=event.repository, number=pr.number, head_sha=pr.head_sha, state=pr.state, labels=pr.labels,
        source_updated_at=pr.updated_at,
    )


@router.post("/github/webhook", status_code=202)
async def receive_webhook(request: Request, hook: VerifiedWebhook) -> JSONResponse:
    """Store the delivery and its dispatches, then answer (see the module docstring for every answer)."""
    state = parts_of(request)
    if hook.event == "ping":
        return _answer(request, hook, 200, "pong", zen=hook.payload.get("zen"))
    if hook.event not in FORWARDED_EVENTS | STORED_EVENTS:
        return _answer(request, hook, 200, "ignored", reason=f"event {hook.event!r} is not handled")
    repository = events_mod.repository_of(hook.payload)
    if repository is None or repository.lower() != state.settings.upstream_repo.lower():
        return _answer(request, hook, 200, "ignored",
                       reason=f"repository {repository!r} is not the upstream {state.settings.upstream_repo!r} (RELAY_UPSTREAM_REPO)")
    try:
        event = events_mod.normalise(hook.event, hook.delivery, hook.payload)
    except PayloadError as exc:
        return _invalid(request, hook, exc)

    if hook.event == "pull_request" and event.action not in trust.PR_ACTIONS:
        return _answer(request, hook, 200, "ignored", reason=f"action {event.kind!r} is not handled")

    outcome, reason, targets, raw = "stored", None, [], None
    if hook.event in STORED_EVENTS:
        raw = hook.body.decode("utf-8", errors="replace")
        reason = "kept for re-run requests; nothing is dispatched"
    else:
        targets, reason = trust.route(event, state.allowlist)
        outcome = "queued" if targets else "recorded"
    try:
        new_dispatches = _new_dispatches(event, targets)
    except PayloadError as exc:
        return _invalid(request, hook, exc)
    delivery = NewDelivery(
        delivery_id=hook.delivery, event=hook.event, action=event.action, repository=event.repository,
        outcome="dispatched" if targets else outcome, summary=event.summary(), reason=reason, payload=raw,
        body_sha256=hashlib.sha256(hook.body).hexdigest(),
    )
    snapshot = _snapshot(event)
    store = state.store
    try:
        # Bounded: a frozen database (or a commit stuck ahead of this one) gets a 503 before GitHub's
        # 10 s run out; the wait's cancellation drops the write if it has not started. A write already
        # under way may still commit: GitHub's redelivery is then answered "duplicate".
        fresh = await asyncio.wait_for(
            asyncio.wrap_future(store.submit_delivery(delivery, new_dispatches, snapshot)), store.deadline_seconds,
        )
    except (StoreUnavailable, TimeoutError) as exc:
        error = str(exc) or f"no commit within {store.deadline_seconds:g}s (RELAY_STORE_DEADLINE_SECONDS)"
        state.metrics.events.labels(hook.event, "store_unavailable").inc()
        log.error("webhook not stored", extra={"event": hook.event, "delivery": hook.delivery, "error": error})
        return JSONResponse(
            {"error": "store_unavailable", "detail": f"delivery {hook.delivery} was not stored; redeliver it once the store is back"},
            status_code=503,
        )
    except StoreRefused as exc:
        state.metrics.events.labels(hook.event, "store_refused").inc()
        log.error("webhook refused by the store", extra={"event": hook.event, "delivery": hook.delivery, "error": str(exc)})
        return JSONResponse({"error": "store_refused", "detail": str(exc)}, status_code=422)
    if not fresh:
        return _answer(request, hook, 200, "duplicate",
                       reason="this delivery, or the same signed body under another delivery id, was already received; "
                              "nothing new is dispatched")
    if targets and state.dispatcher is not None:
        state.dispatcher.wake()
    if hook.event in STORED_EVENTS:
        state.results.rerun_requested()  # the re-run watcher decides now, not at its next poll
    if snapshot is not None:
        # New labels (or a new head) can change what a PR's checks show (an L3 label): reporting looks
        # now instead of at its next poll.
        state.results.run_changed()
    fields: dict[str, Any] = {"dispatches": [t.name for t in targets]}
    if reason:
        fields["reason"] = reason
    return _answer(request, hook, 202, outcome, **fields)


def rejection_handler(_request: Request, exc: WebhookRejected) -> JSONResponse:
    return JSONResponse({"error": exc.error, "detail": exc.detail}, status_code=exc.status, headers=exc.headers)
