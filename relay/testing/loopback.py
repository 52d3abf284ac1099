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
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the default (5) drops bursts of connections into 1 s SYN retries


class LoopbackServer:
    """Base of the fakes: ``start()``, ``stop()``, ``url``, and use as a context manager."""

    _server: _Server | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def start(self):
        self._server = _Server(("127.0.0.1", 0), self.handler())
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         name=type(self).__name__, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
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
