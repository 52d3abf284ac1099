"""HTTP to the relay: one request at a time, never a redirect, retries with backoff for what may pass.

Redirects are refused, not followed: urllib would follow a 301/302/303 to any host as a ``GET`` with the
``Authorization`` header, handing the credential to whoever answers, and the callback would look
delivered. A 3xx is an answer like any other 4xx: the relay URL is wrong, and a retry cannot fix it.

Retried: 408, 429, 5xx and network errors, with exponential backoff (``Retry-After`` honoured) within the
policy's time. Never retried: 413 (the body is over the relay's limits; the same body would be refused
again, see ``report_fit``) and every other 4xx.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from conformance.callback.workflow_log import annotate

RETRIED_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class CallbackFailed(Exception):
    """The callback could not be delivered: the relay refused it, or retries ran out. The message says which;
    ``code`` is the relay's error code when it refused (e.g. ``completed_before_in_progress``)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class RetryPolicy:
    """Exponential backoff with jitter within ``max_seconds`` in total; ``Retry-After`` wins when given."""

    max_seconds: float = 300.0
    first_delay: float = 1.0
    max_delay: float = 60.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, retry_after)
        return min(self.max_delay, self.first_delay * 2 ** attempt) * random.uniform(0.5, 1.0)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: rare from the relay; fall back to our own backoff
        return None


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def describe(self) -> str:
        if 300 <= self.status < 400:
            location = self.headers.get("Location") or self.headers.get("location") or "(no Location)"
            return (f"HTTP {self.status} redirect to {location}: not followed, the credential is never sent on a "
                    "redirect; set the relay URL to the address that answers")
        data = self.json()
        if "error" in data or "detail" in data:
            return f"HTTP {self.status} {data.get('error', '')}: {data.get('detail', '')}".strip()
        return f"HTTP {self.status}: {self.body[:300].decode('utf-8', 'replace')}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None  # urllib then raises HTTPError with the 3xx, which request() turns into an Answer


_opener = urllib.request.build_opener(_NoRedirects)


def request(method: str, url: str, headers: dict[str, str], data: bytes | None, timeout: float) -> Answer:
    """One HTTP request; any status comes back as an Answer (network errors raise URLError/OSError)."""
    prepared = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with _opener.open(prepared, timeout=timeout) as response:
            return Answer(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(), dict(exc.headers or {}))


def with_retries(what: str, send: Callable[[], Answer], policy: RetryPolicy) -> tuple[Answer, bool]:
    """Call ``send`` until it answers something other than 408/429/5xx/a network error, within the policy.

    Returns the answer and whether an earlier attempt may have reached the server (its answer lost)."""
    deadline = policy.clock() + policy.max_seconds
    attempt, maybe_delivered, last = 0, False, ""
    while True:
        retry_after = None
        try:
            answer = send()
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            last, maybe_delivered = f"network error: {reason}", True
        else:
            if answer.status not in RETRIED_STATUSES:
                return answer, maybe_delivered
            last, retry_after = answer.describe(), _retry_after(answer.headers)
            maybe_delivered = maybe_delivered or answer.status >= 500
        wait = policy.delay(attempt, retry_after)
        left = deadline - policy.clock()
        if wait > left:
            raise CallbackFailed(
                f"{what}: gave up after {attempt + 1} attempts within {policy.max_seconds:g} s; last: {last}"
                + (f" (Retry-After {retry_after:g} s is beyond the time left)" if retry_after is not None else "")
            )
        annotate("warning", f"{what}: {last}; retrying in {wait:.1f} s")
        policy.sleep(wait)
        attempt += 1
