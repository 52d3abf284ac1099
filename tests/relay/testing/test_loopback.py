"""The loopback server under every fake: it serves until stopped, and a stop ends its loop at once without
cutting off a request already being answered."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from relay.testing.loopback import LoopbackServer, loopback_client


class GateServer(LoopbackServer):
    """Answers ``/`` at once and ``/gated`` when ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gated_request_arrived = threading.Event()

    def handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/gated":
                    server.gated_request_arrived.set()
                    server.gate.wait(30)
                self.send_response(200)  # HTTP/1.0: the body ends with the connection
                self.end_headers()
                self.wfile.write(self.path.encode())

            def log_message(self, *args):
                pass

        return Handler


def _serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == GateServer.__name__]


def test_stop_ends_the_serving_loop_and_closes_the_port():
    server = GateServer().start()
    port = int(server.url.rsplit(":", 1)[1])
    assert loopback_client().get(f"{server.url}/").text == "/"
    assert len(_serving_threads()) == 1
    server.stop()
    assert _serving_threads() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    server.stop()  # stopping again does nothing


def test_a_request_being_answered_when_the_server_stops_still_gets_its_answer():
    server = GateServer().start()
    answers: list = []
    client = threading.Thread(target=lambda: answers.append(loopback_client().get(f"{server.url}/gated", timeout=30)))
    client.start()
    assert server.gated_request_arrived.wait(30)
    server.stop()
    server.gate.set()
    client.join(30)
    assert [(a.status_code, a.text) for a in answers] == [(200, "/gated")]


def test_a_stopped_server_starts_again():
    with GateServer() as server:
        server.stop()
        server.start()
        assert loopback_client().get(f"{server.url}/again").text == "/again"
    assert _serving_threads() == []
