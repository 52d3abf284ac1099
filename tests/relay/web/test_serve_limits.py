"""``relay serve`` as a real process: a connection whose request headers do not arrive within
RELAY_HTTP_HEADER_TIMEOUT_SECONDS is closed, on its first request and on a later keep-alive request,
while complete requests are served as usual."""

from __future__ import annotations

import socket


from relay.testing import loopback_client
from tests.relay.helpers import RelayProcess
from tests.relay.faults.test_crash_safety import _env


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes (True) or answers (False); the socket's own timeout is the bound."""
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data == b""
        data += chunk
        if b"\r\n\r\n" in data:
            return False


def test_slow_headers_are_cut_off(sqlite_url, fake_github, backends_dir, tmp_path):
    env = _env(sqlite_url, fake_github, backends_dir, RELAY_HTTP_HEADER_TIMEOUT_SECONDS="0.5")
    relay = RelayProcess(env, tmp_path / "relay.log").start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
            assert _closed_by_server(sock)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}"):  # the whole JSON answer of the first request
                chunk = sock.recv(65536)
                assert chunk, "the server closed instead of answering"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHo")  # a second request on the same connection stalls
            assert _closed_by_server(sock)
        assert loopback_client().get(f"{relay.url}/readyz", timeout=10).status_code == 200
    finally:
        relay.stop()
