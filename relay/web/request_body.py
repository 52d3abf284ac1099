"""Reading a request body under a size cap, shared by the webhook intake and the callback endpoint.

A declared ``Content-Length`` over the cap is refused before anything is kept; a body that grows past
the cap while streaming is refused as soon as it does, so an oversized upload never sits in memory.
Before a 413 the rest of the body is read and thrown away (:func:`drain`, up to a bound): a client that
is still sending would otherwise see its connection reset instead of the answer, and retry a body that
can never fit. A client that sent ``Expect: 100-continue`` gets the 413 without being asked for its body.
Bodies read before authentication share a byte budget (:class:`BodyBudget`, 503 when full), and every
body has a deadline to arrive (408), so slow or stalled uploads cannot pile up.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

__all__ = ["BodyBudget", "BodyRefused", "drain", "read_capped"]

# What is read and discarded before a 413, at most: enough for any honest client's oversized report
# (the callback limit is 8 MiB by default), small enough that a flood costs bandwidth only for a while.
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 10.0


class BodyRefused(Exception):
    """The body cannot be accepted: ``status`` 400, 408, 413 or 503, a stable ``code``, a ``detail`` for people."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


class BodyBudget:
    """Bytes of request bodies being read before their sender is authenticated, across all requests.

    A webhook's body must be read whole before its HMAC can be checked, so without a bound anyone
    could hold memory with unsigned uploads. Each read reserves its declared ``Content-Length`` (or
    its bytes as they arrive) and is refused with 503 when the reservation does not fit; it is given
    back when the read ends. Used from the event loop only, so no lock.
    """

    def __init__(self, limit_bytes: int, setting: str = "RELAY_UNAUTHENTICATED_BODY_BUDGET_BYTES"):
        self.limit = limit_bytes
        self.used = 0
        self.setting = setting

    def reserve(self, size: int) -> None:
        if self.used + size > self.limit:
            raise BodyRefused(
                503, "busy",
                f"{self.used} bytes of unauthenticated request bodies are being read; {size} more would exceed "
                f"{self.limit} ({self.setting}); retry shortly",
                headers={"Retry-After": "5"},
            )
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size


async def drain(request: Request, already: int = 0) -> None:
    """Read and discard what is left of ``request``'s body, up to :data:`DRAIN_BYTES` in all and
    :data:`DRAIN_SECONDS`, so the answer that follows reaches a client still sending; nothing is kept.

    A client waiting for ``100 Continue`` is not asked for its body; a body over the bound, or slower,
    is left unread (the connection closes after the answer, as before)."""
    if request.headers.get("expect", "").lower() == "100-continue":
        return

    async def discard() -> None:
        size = already
        async for chunk in request.stream():
            size += len(chunk)
            if size > DRAIN_BYTES:
                return

    try:
        await asyncio.wait_for(discard(), DRAIN_SECONDS)
    except (asyncio.TimeoutError, OSError, RuntimeError):  # slow, reset, or already read: nothing to drain
        pass


async def read_capped(request: Request, limit: int, setting: str, *, budget: BodyBudget | None = None,
                      timeout: float | None = None) -> bytes:
    """read_capped(request, limit, setting, budget=, timeout=) -> body; ``setting`` names the knob that sets ``limit``.

    ``budget``: the shared reservation for bodies read before authentication (503 when full);
    ``timeout``: seconds the whole body may take to arrive (408 after), so a half-sent request does
    not hold its connection and reservation forever.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyRefused(400, "bad_request", "Content-Length is not a number")
        if int(declared) > limit:
            await drain(request)
            raise BodyRefused(413, "payload_too_large",
                              f"body of {declared} bytes exceeds the limit of {limit} bytes ({setting})")
    reserved = 0

    async def stream() -> bytes:
        nonlocal reserved
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                await drain(request, size)
                raise BodyRefused(413, "payload_too_large", f"body exceeds the limit of {limit} bytes ({setting})")
            if budget is not None and size > reserved:
                budget.reserve(size - reserved)
                reserved = size
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        if budget is not None and declared is not None:
            budget.reserve(int(declared))
            reserved = int(declared)
        return await asyncio.wait_for(stream(), timeout)
    except asyncio.TimeoutError:
        raise BodyRefused(408, "body_timeout",
                          f"the body did not arrive within {timeout} s (RELAY_BODY_READ_TIMEOUT_SECONDS)") from None
    finally:
        if budget is not None:
            budget.release(reserved)
