"""HTTP on 127.0.0.1: the server under each fake, and the client tests reach local servers with.

A fake subclasses ``LoopbackServer`` and implements ``handler()``; it then starts and stops like
any server (``with FakeX() as fake: fake.url``). Served by a daemon thread on an OS-chosen port.

``loopback_client()`` is what tests send requests to a relay or a fake with. ``httpx.post`` and its
kin build a client per call, and with it a TLS context that loads the whole CA bundle (about 30 ms of
CPU) for a plain-HTTP request; the relay's tests sent thousands. The shared client keeps no connection
alive, so every request still opens its own connection, as ``httpx.post`` does.
"""

from __future__ import annotations

import functools
import selectors
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

__all__ = ["LoopbackServer", "loopback_client"]


@functools.cache
def loopback_client() -> httpx.Client:
    """The process's client for servers on this machine (thread-safe; proxy settings of the environment,
    meant for the outside world, are ignored)."""
    return httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


class _Server(ThreadingHTTPServer):
    """Serves until ``stop_serving()``, which ends the loop at once: ``serve_forever`` notices a
    ``shutdown()`` only at its next poll (0.025 s on average at a 0.05 s poll, at the end of every test
    that starts a fake)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the default (5) drops bursts of connections into 1 s SYN retries

    def server_activate(self) -> None:
        super().server_activate()
        self._stopping = threading.Event()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread: threading.Thread | None = None

    def start_serving(self, name: str) -> None:
        self._thread = threading.Thread(target=self._serve_until_stopped, name=name, daemon=True)
        self._thread.start()

    def _serve_until_stopped(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping.is_set():
                        self._handle_request_noblock()
                self.service_actions()

    def stop_serving(self) -> None:
        """End the loop and wait for it (requests being handled go on in their own threads)."""
        self._stopping.set()
        self._wake_writer.send(b"\0")
        if self._thread is not None:
            self._thread.join()

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()


class LoopbackServer:
    """Base of the fakes: ``start()``, ``stop()``, ``url``, and use as a context manager."""

    _server: _Server | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def start(self):
        self._server = _Server(("127.0.0.1", 0), self.handler())
        self._server.start_serving(type(self).__name__)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop_serving()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, f"start() the {type(self).__name__} first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"
