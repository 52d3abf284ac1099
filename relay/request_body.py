"""Reading a request body under a size cap, shared by the webhook intake and the callback endpoint.

A declared ``Content-Length`` over the cap is refused before anything is read; a body that grows past
the cap while streaming is refused as soon as it does, so an oversized upload never sits in memory.
"""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["BodyRefused", "read_capped"]


class BodyRefused(Exception):
    """The body cannot be accepted: ``status`` 400 or 413, a stable ``code`` and a ``detail`` for people."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


async def read_capped(request: Request, limit: int, setting: str) -> bytes:
    """read_capped(request, limit, setting) -> body; ``setting`` names the knob that sets ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyRefused(400, "bad_request", "Content-Length is not a number")
        if int(declared) > limit:
            raise BodyRefused(413, "payload_too_large",
                              f"body of {declared} bytes exceeds the limit of {limit} bytes ({setting})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyRefused(413, "payload_too_large", f"body exceeds the limit of {limit} bytes ({setting})")
        chunks.append(chunk)
    return b"".join(chunks)
