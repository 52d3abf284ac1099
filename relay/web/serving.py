"""How ``relay serve`` runs uvicorn: bounded connections, idle keep-alive closed, and a deadline for headers.

uvicorn's HTTP/1.1 protocol (h11) waits for a request's headers as long as a client likes, so a
client that opens connections and trickles headers (slowloris) would hold them forever.
:class:`HeaderDeadlineProtocol` starts a timer when a connection opens and again after each
response; if no complete request head has arrived when it fires, the connection is closed. Bodies
have their own deadline (:mod:`relay.web.request_body`).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderDeadlineProtocol", "protocol_with_header_deadline", "uvicorn_options"]


class HeaderDeadlineProtocol(H11Protocol):
    """h11 protocol that closes a connection whose request head is not complete within ``header_timeout``."""

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm(self) -> None:
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head was parsed: the request is under way
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being handled; its body has its own deadline
        if not self.transport.is_closing():
            self.transport.close()


def protocol_with_header_deadline(seconds: float) -> type[HeaderDeadlineProtocol]:
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": seconds})


def uvicorn_options(settings) -> dict:
    """Keyword arguments for ``uvicorn.run`` from the settings (see docs/relay-security.md)."""
    return dict(
        http=protocol_with_header_deadline(settings.http_header_timeout_seconds),
        limit_concurrency=settings.http_max_connections,
        timeout_keep_alive=settings.http_keep_alive_seconds,
    )
