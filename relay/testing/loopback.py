"""The HTTP server under each fake: 127.0.0.1, an OS-chosen port, served by a daemon thread.

A fake subclasses ``LoopbackServer`` and implements ``handler()``; it then starts and stops like
any server (``with FakeX() as fake: fake.url``).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["LoopbackServer"]


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
