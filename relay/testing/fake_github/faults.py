"""What a test scripts and reads of the fake GitHub: a :class:`Fault` (an answer instead of the normal
one) and a :class:`RecordedRequest` (every request, with its answer)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any


__all__ = ["Fault", "RecordedRequest"]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scripted answer: a delay, and optionally a status, headers and body instead of the normal answer."""

    status: int | None = None
    delay: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    disconnect: bool = False

    @classmethod
    def slow(cls, seconds: float) -> "Fault":
        return cls(delay=seconds)

    @classmethod
    def server_error(cls, status: int = 502) -> "Fault":
        return cls(status=status, body={"message": "Server Error"})

    @classmethod
    def rate_limited(cls, retry_after: float = 1) -> "Fault":
        return cls(status=429, headers=(("Retry-After", f"{retry_after:g}"),), body={"message": "Too many requests"})

    @classmethod
    def secondary_limit(cls, retry_after: float | None = None) -> "Fault":
        headers = () if retry_after is None else (("Retry-After", f"{retry_after:g}"),)
        return cls(status=403, headers=headers, body={
            "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
        })

    @classmethod
    def primary_exhausted(cls, reset_in: float = 1) -> "Fault":
        reset = int(time.time() + reset_in + 0.999)
        return cls(status=403, headers=(("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", str(reset))),
                   body={"message": "API rate limit exceeded"})

    @classmethod
    def unprocessable(cls, message: str = "Validation Failed") -> "Fault":
        return cls(status=422, body={"message": message})

    @classmethod
    def not_found(cls) -> "Fault":
        return cls(status=404, body={"message": "Not Found"})

    @classmethod
    def bad_credentials(cls) -> "Fault":
        return cls(status=401, body={"message": "Bad credentials"})

    @classmethod
    def dropped(cls) -> "Fault":
        return cls(disconnect=True)


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    endpoint: str | None
    repository: str | None
    headers: dict[str, str]
    json: Any
    received_at: float  # when the answer was ready (after any scripted delay)
    answered: int | None  # status sent back (None: connection dropped)
    arrived_at: float = 0.0  # when the request came in
