"""Dispatcher: drains the outbox into ``repository_dispatch`` calls, one lane per backend.

Triggered by intake (``wake()`` after a delivery is stored), by its own poll timer (rows written by
other processes, retries coming due, leases of dead processes expiring) and at start-up. Reads and
writes outbox rows through the store; calls GitHub through :mod:`relay.github`.

How it works, in order:

1. One loop thread claims due rows: the oldest of each backend that is idle (no call in flight) and
   whose credential may send (not rate limited, pacing allows), and no more rows than those credentials
   may send now. A claim is a lease: if this process dies, the row becomes claimable again when the
   lease runs out, so nothing is lost; sooner when a process on the same machine sees the claimer is
   dead (``claimers``: checked at most every few seconds, before a claim).
2. Each claimed row is sent on a worker thread; backends never wait for each other, so one slow or
   failing downstream delays only its own lane.
3. The outcome is written back: ``sent`` (in the same transaction, the run it starts gets its
   ``dispatched`` row, or the runs a ``closed`` event ends are cancelled; then reporting is woken);
   ``queued`` again with exponential backoff and jitter
   (5xx, network); ``queued`` after the wait GitHub asked for (rate limits, which also rest every
   backend sharing that credential, in every process); ``queued`` again after a pause of the
   credential when GitHub refused it (401: the credential is at fault, not the row, so nothing is
   failed for it); ``failed`` with the reason (404, 422, or out of attempts).

Delivery is at least once, and a row can reach downstream twice, with the same ``delivery`` and
``nonce`` (downstream drops the copy by them): when a process dies after GitHub accepted the call and
before the outcome was written; and without any crash, when GitHub accepts a call but answers slower
than ``RELAY_GITHUB_TIMEOUT_SECONDS`` (or the connection drops after the request was sent): the relay
cannot tell that from a call that never arrived, so it retries. ``repository_dispatch`` has no
idempotency key, so this cannot be avoided on the relay's side; see docs/relay-faults.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

from relay.dispatch.claimers import known_dead, own_claimer
from relay.github import DispatchSender, GitHubCallError, PermanentError, RateLimitedError, RetryableError
from relay.metrics import Metrics
from relay.periodic import PeriodicThread
from relay.store import ClaimedDispatch, DispatchState, Store, StoreUnavailable
from relay.store.base import utcnow

__all__ = ["CredentialGates", "Dispatcher"]

# Empty claims are at least this far apart: a burst of webhooks wakes the loop once per webhook.
_EMPTY_CLAIM_GAP_SECONDS = 0.02
# How often the claims of other processes are looked at for dead claimers (one indexed read).
_DEAD_CLAIMS_CHECK_SECONDS = 2.0

log = logging.getLogger("relay.dispatch")


class CredentialGates:
    """Per-credential rate-limit state, kept in the store so every relay process shares it: rests
    ordered by GitHub, pauses after GitHub refused the credential (401), and a token bucket for pacing.

    ``per_minute`` paces content-creating calls (GitHub allows about 80 a minute); the bucket holds a
    minute's worth, so bursts up to that size go out at once. 0 disables pacing.
    """

    def __init__(self, store: Store, per_minute: float):
        self._store = store
        self._per_minute = per_minute

    def rest(self, credential: str, seconds: float) -> None:
        self._store.rest_credential(credential, seconds, per_minute=self._per_minute)

    def pause(self, credential: str, seconds: float, reason: str) -> None:
        """GitHub refused ``credential``: no calls with it for ``seconds``, then one tries it again."""
        self._store.rest_credential(credential, seconds, per_minute=self._per_minute, paused=True, reason=reason)

    def resume(self, credential: str) -> None:
        self._store.resume_credential(credential)

    def allowances(self, credentials: Collection[str]) -> dict[str, int]:
        """How many calls each credential may make now: 0 while it rests, else the whole tokens in its bucket."""
        return self._store.credential_allowances(credentials, per_minute=self._per_minute) if credentials else {}

    def allowance(self, credential: str) -> int:
        return self.allowances([credential])[credential]

    def take(self, credential: str) -> tuple[float, bool]:
        """Reserve one call now: (0, paused) if reserved, else (the seconds to wait, paused); nothing
        is reserved when there is a wait. ``paused``: the credential was refused before this call."""
        return self._store.take_credential(credential, per_minute=self._per_minute)


class Dispatcher:
    """Dispatcher(store, github, ...): start() a loop thread and workers; stop() drains in-flight calls."""

    def __init__(
        self,
        store: Store,
        github: DispatchSender,
        *,
        concurrency: int = 64,
        poll_seconds: float = 1.0,
        lease_seconds: float = 60.0,
        max_attempts: int = 8,
        backoff_base_seconds: float = 5.0,
        backoff_max_seconds: float = 900.0,
        requests_per_minute: float = 80.0,
        credential_pause_seconds: float = 60.0,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
        claimer: str | None = None,
    ):
        self.store = store
        self.github = github
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base_seconds
        self.backoff_max = backoff_max_seconds
        self.gates = CredentialGates(store, requests_per_minute)
        self.credential_pause_seconds = credential_pause_seconds
        self.metrics = metrics or Metrics()
        self.rng = rng or random.Random()
        # Names this process in claimed_by; unique so a restarted process never mistakes old claims for its own,
        # and checkable, so another process on this machine can tell when this one is dead.
        self.claimer = claimer or own_claimer()
        self._dead_claims_checked_at = float("-inf")
        self._periodic = PeriodicThread("relay-dispatcher", poll_seconds, self.claim_and_submit, next_wait=self._next_wait)
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # backends with a call in flight
        self._credential_of: dict[str, str] = {}  # backend -> credential, learnt on first send
        self._pool: ThreadPoolExecutor | None = None
        self._next_claim_at = float("-inf")  # no claim before: 20 ms after an empty one
        self._wait = 0.0  # after this pass, until the next
        # Called after a dispatch is recorded sent (its run row written in that transaction): reporting.
        self.on_sent: Callable[[], None] | None = None

    @classmethod
    def from_settings(cls, settings, store: Store, github: DispatchSender, metrics: Metrics) -> "Dispatcher":
        return cls(
            store, github,
            concurrency=settings.dispatch_concurrency,
            poll_seconds=settings.dispatch_poll_seconds,
            lease_seconds=settings.dispatch_lease_seconds,
            max_attempts=settings.dispatch_max_attempts,
            backoff_base_seconds=settings.dispatch_backoff_base_seconds,
            backoff_max_seconds=settings.dispatch_backoff_max_seconds,
            requests_per_minute=settings.github_content_requests_per_minute,
            credential_pause_seconds=settings.dispatch_credential_pause_seconds,
            metrics=metrics,
        )

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="relay-dispatch")
        self._periodic.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._periodic.stop(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def wake(self) -> None:
        """Look at the outbox now (intake calls this after storing a delivery)."""
        self._periodic.wake()

    # --- one pass -------------------------------------------------------------------------------
    def claim_and_submit(self) -> None:
        """Claim what is due and hand each row to a sender; say how long to wait before the next claim."""
        self._wait = self.poll_seconds  # also after a pass that raised
        gap = self._next_claim_at - time.monotonic()
        if gap > 0:
            self._periodic.pause(gap)
        started = time.monotonic()
        try:
            claimed = self.claim_once()
        except StoreUnavailable as exc:
            log.warning("outbox unreachable; retrying", extra={"error": str(exc)})
            return
        for row in claimed:
            self._pool.submit(self._send, row)
        if claimed:
            self._wait = 0.0  # more may be due for other backends
            return
        self._next_claim_at = started + _EMPTY_CLAIM_GAP_SECONDS
        self._wait = self._idle_wait()

    def _next_wait(self) -> float:
        return self._wait

    def _idle_wait(self) -> float:
        """After a claim found nothing: sleep until something can change that by itself (a retry or a
        lease coming due, a credential's rest ending), or the poll. Rows already due but blocked (their
        backend busy, their credential resting) need no polling: a finished send or a webhook wakes the
        loop, and a rest's end is in the wait."""
        try:
            due_in = self.store.seconds_until_next_due()
        except StoreUnavailable:
            return self.poll_seconds
        wait = self.poll_seconds if due_in is None else min(self.poll_seconds, due_in + 0.01)
        return max(wait, 0.005)

    def _claim_bounds(self) -> tuple[set[str], int | None]:
        """Backends not to claim for (busy, or their credential may not send now), and at most how many
        rows to claim: the calls the known credentials may make now (None: none of them may).

        A row claimed beyond its credential's allowance would only be put back (a second transaction for
        nothing). Credentials are learnt on a backend's first send; until then its rows are not bounded.
        """
        with self._lock:
            excluded = set(self._busy)
            credentials = dict(self._credential_of)
        allowance = self.gates.allowances(set(credentials.values()))
        excluded.update(backend for backend, credential in credentials.items() if allowance[credential] == 0)
        open_calls = [calls for calls in allowance.values() if calls > 0]
        return excluded, (sum(open_calls) if open_calls else None)

    def claim_once(self) -> list[ClaimedDispatch]:
        """Claim what may be sent now, mark those backends busy, and return the claimed rows."""
        with self._lock:
            free = self.concurrency - len(self._busy)
        if free <= 0:
            return []
        self._end_dead_claims()
        excluded, allowed = self._claim_bounds()
        claimed = self.store.claim_dispatches(
            self.claimer, limit=max(4 * free, 64), lease_seconds=self.lease_seconds,
            exclude_backends=excluded, max_claims=free if allowed is None else min(free, allowed),
        )
        with self._lock:
            self._busy.update(row.backend for row in claimed)
        self.metrics.claims.labels("rows" if claimed else "empty").inc()
        return claimed

    def _end_dead_claims(self) -> None:
        """End the leases of claimers known dead (a process of this machine killed mid-send), so their
        rows are claimed now rather than when the lease runs out."""
        if time.monotonic() - self._dead_claims_checked_at < _DEAD_CLAIMS_CHECK_SECONDS:
            return
        self._dead_claims_checked_at = time.monotonic()
        for claimer in self.store.live_claimers():
            if claimer != self.claimer and known_dead(claimer):
                ended = self.store.end_claims(claimer)
                log.warning("claims of a dead process ended: its rows are due again",
                            extra={"claimer": claimer, "rows": ended})

    # --- one send -------------------------------------------------------------------------------
    def _send(self, row: ClaimedDispatch) -> None:
        try:
            self.send(row)
        except Exception:
            log.exception("dispatch crashed", extra={"dispatch": row.id, "delivery": row.delivery_id})
        finally:
            with self._lock:
                self._busy.discard(row.backend)
            self._periodic.wake()

    def _finish(self, row: ClaimedDispatch, **outcome) -> bool:
        """Record the outcome; True when it was written (this process still held the claim)."""
        try:
            kept = self.store.finish_dispatch(row.id, self.claimer, **outcome)
        except StoreUnavailable as exc:
            # The lease will run out and the row will be claimed again: at least once, never lost.
            log.error("could not record a dispatch outcome", extra={"dispatch": row.id, "error": str(exc)})
            return False
        if not kept:
            log.warning(
                "dispatch claim lost before its outcome was recorded (lease expired)",
                extra={"dispatch": row.id, "delivery": row.delivery_id, "backend": row.backend},
            )
        return kept

    def _backoff(self, attempts: int) -> float:
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** max(attempts - 1, 0))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)  # "equal jitter": never less than half

    def send(self, row: ClaimedDispatch) -> None:
        """Send one claimed row and record its outcome."""
        context = {"dispatch": row.id, "delivery": row.delivery_id, "backend": row.backend, "repository": row.repository}
        started = time.monotonic()
        credential, was_paused = "", False
        try:
            credential = self._credential_of.get(row.backend) or self.github.credential_for(row.repository)
            with self._lock:
                self._credential_of[row.backend] = credential
            wait, was_paused = self.gates.take(credential)
            if wait > 0:
                self._finish(row, state=DispatchState.queued, attempted=False, retry_in_seconds=wait,
                             last_error=f"paced: credential {credential} busy for {wait:.1f}s")
                return
            started = time.monotonic()
            result = self.github.repository_dispatch(row.repository, row.event_type, row.client_payload)
        except RateLimitedError as exc:
            self.gates.rest(exc.credential or credential or "token", exc.wait_seconds)
            self.metrics.retries.labels("rate_limited").inc()
            self.metrics.dispatch_seconds.labels("rate_limited").observe(time.monotonic() - started)
            log.warning("rate limited", extra={**context, "wait_seconds": exc.wait_seconds, "status": exc.status})
            self._finish(row, state=DispatchState.queued, attempted=False, retry_in_seconds=exc.wait_seconds,
                         last_error=f"rate limited: {exc.message}", last_status=exc.status)
            return
        except PermanentError as exc:
            if exc.status == 401:
                self._pause(row, context, exc, credential, started)
                return
            self.metrics.dispatch_seconds.labels("permanent").observe(time.monotonic() - started)
            self._fail(row, context, exc, reason=f"permanent_{exc.status or 'error'}")
            return
        except (RetryableError, GitHubCallError, Exception) as exc:
            if not isinstance(exc, GitHubCallError):
                log.exception("unexpected error while dispatching", extra=context)
                exc = RetryableError(f"{type(exc).__name__}: {exc}")
            self._retry(row, context, exc, started)
            return
        elapsed = time.monotonic() - started
        if was_paused:
            self.gates.resume(credential)
            log.warning("credential accepted again; dispatch resumes", extra={**context, "credential": credential})
        if result.pause_seconds:
            self.gates.rest(result.credential, result.pause_seconds)
        self.metrics.dispatch_seconds.labels("sent").observe(elapsed)
        self.metrics.dispatch_delay.observe(max((utcnow() - row.created_at).total_seconds(), 0.0))
        self.metrics.sent.inc()
        log.info("dispatched", extra={**context, "seconds": round(elapsed, 4)})
        if self._finish(row, state=DispatchState.sent, attempted=True, last_status=result.status) and self.on_sent:
            self.on_sent()

    def _pause(self, row: ClaimedDispatch, context: dict, exc: GitHubCallError, credential: str, started: float) -> None:
        """GitHub refused the credential (401): a verdict on the credential, not on the row. Every
        process stops calling with it for ``credential_pause_seconds``; then one call tries it again.
        The row goes back to the queue with its attempts untouched."""
        credential = exc.credential or credential or "token"
        self.metrics.dispatch_seconds.labels("bad_credentials").observe(time.monotonic() - started)
        self.metrics.retries.labels("credential_paused").inc()
        log.error("credential refused; its dispatches pause", extra={
            **context, "credential": credential, "pause_seconds": self.credential_pause_seconds, "error": exc.message})
        self.gates.pause(credential, self.credential_pause_seconds, exc.message)
        self._finish(row, state=DispatchState.queued, attempted=False, retry_in_seconds=self.credential_pause_seconds,
                     last_error=f"credential {credential} paused: {exc.message}", last_status=exc.status)

    def _retry(self, row: ClaimedDispatch, context: dict, exc: GitHubCallError, started: float) -> None:
        self.metrics.dispatch_seconds.labels("retryable").observe(time.monotonic() - started)
        attempts = row.attempts + 1
        if attempts >= self.max_attempts:
            self._fail(row, context, exc, reason="out_of_attempts",
                       message=f"gave up after {attempts} attempts; last: {exc.message}")
            return
        delay = self._backoff(attempts)
        self.metrics.retries.labels("server_or_network").inc()
        log.warning("dispatch will be retried", extra={**context, "attempt": attempts, "retry_in": round(delay, 3),
                                                        "error": exc.message})
        self._finish(row, state=DispatchState.queued, attempted=True, retry_in_seconds=delay,
                     last_error=exc.message, last_status=exc.status)

    def _fail(self, row: ClaimedDispatch, context: dict, exc: GitHubCallError, *, reason: str, message: str | None = None) -> None:
        self.metrics.failures.labels(reason).inc()
        log.error("dispatch failed", extra={**context, "error": message or exc.message, "status": exc.status})
        self._finish(row, state=DispatchState.failed, attempted=True, last_error=message or exc.message,
                     last_status=exc.status)
