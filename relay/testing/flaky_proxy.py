"""A forwarding proxy on 127.0.0.1 that can answer some requests itself, to test a client's retries.

Started by a test in front of a real server (``with FlakyProxy(relay.url) as proxy: proxy.url``); it
forwards every request (method, path, headers, body) to the target and relays the answer, except
that ``proxy.fail(503, 429, path="/github/callback", retry_after=1)`` makes the next matching
requests answer those statuses without reaching the target (``drop`` closes the connection instead).
``proxy.seen`` lists ``(method, path, status)`` of every request, forwarded or not.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler

from relay.testing.loopback import LoopbackServer

__all__ = ["DROP", "FlakyProxy"]

DROP = 0  # a scripted "status" that closes the connection without an answer
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class FlakyProxy(LoopbackServer):
    def __init__(self, target: str):
        self.target = urllib.parse.urlsplit(target)
        self.seen: list[tuple[str, str, int]] = []
        self._script: list[tuple[str, int, float | None]] = []
        self._lock = threading.Lock()

    def fail(self, *statuses: int, path: str = "/", retry_after: float | None = None) -> None:
        """Answer the next ``len(statuses)`` requests whose path starts with ``path`` with these statuses."""
        with self._lock:
            self._script.extend((path, status, retry_after) for status in statuses)

    def _scripted(self, path: str) -> tuple[int, float | None] | None:
        with self._lock:
            for index, (prefix, status, retry_after) in enumerate(self._script):
                if path.startswith(prefix):
                    del self._script[index]
                    return status, retry_after
        return None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and the
            # client's delayed ACK add ~40 ms to every answer on loopback.
            disable_nagle_algorithm = True

            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                scripted = proxy._scripted(self.path)
                if scripted is not None:
                    status, retry_after = scripted
                    proxy.seen.append((self.command, self.path, status))
                    if status == DROP:
                        self.close_connection = True
                        self.connection.close()
                        return
                    headers = [("Content-Type", "application/json")]
                    if retry_after is not None:
                        headers.append(("Retry-After", f"{retry_after:g}"))
                    data = json.dumps({"error": "scripted", "detail": f"the proxy answered {status}"}).encode()
                    return self._answer(status, headers, data)
                connection = http.client.HTTPConnection(proxy.target.hostname, proxy.target.port, timeout=60)
                try:
                    forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    connection.request(self.command, self.path, body=body, headers=forwarded)
                    response = connection.getresponse()
                    data = response.read()
                    proxy.seen.append((self.command, self.path, response.status))
                    self._answer(response.status, response.getheaders(), data)
                finally:
                    connection.close()

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

        return Handler
