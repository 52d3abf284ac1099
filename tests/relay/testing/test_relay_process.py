"""``RelayProcess`` counts a relay as up only when that relay itself answers on its port, and a relay forked
from the pre-imported parent serves, logs and ends as the command started afresh does.

``free_port`` hands out a port that was free a moment ago; under xdist another worker's server can take
it before ``relay serve`` binds it. Then ``/readyz`` on that port answers 200 from the other server
while this relay fails to bind and exits, and a test goes on against the wrong process.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading

import pytest

from relay.testing.relay_process import CHECKOUT, RelayProcess
from tests.relay.faults.test_crash_safety import _env
from tests.relay.helpers import push_payload


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_port_taken_by_another_server_is_not_taken_for_the_relay(sqlite_url, fake_github, backends_dir, tmp_path):
    relay = RelayProcess(_env(sqlite_url, fake_github, backends_dir), tmp_path / "relay.log")
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", relay.port), _Healthy)  # answers /readyz with 200
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    taken_port = relay.port
    try:
        relay.start()
        try:
            assert relay.port != taken_port
            assert relay.process.poll() is None
            log = (tmp_path / "relay.log").read_text()
            assert "address already in use" in log.lower()  # the first try met the impostor
            assert f"Uvicorn running on http://127.0.0.1:{relay.port}" in log
        finally:
            relay.stop()
    finally:
        impostor.shutdown()
        impostor.server_close()


def test_a_relay_that_does_not_come_up_in_time_is_not_left_running(sqlite_url, fake_github, backends_dir, tmp_path):
    relay = RelayProcess(_env(sqlite_url, fake_github, backends_dir), tmp_path / "relay.log")
    with pytest.raises(RuntimeError, match="relay serve did not become healthy"):
        relay.start(timeout=0)
    assert relay.process.poll() is not None  # killed and reaped, not serving on for the rest of the run


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_relay_forked_or_fresh_serves_logs_and_ends_as_the_command_does(fresh, sqlite_url, fake_github, backends_dir,
                                                                         tmp_path):
    first = RelayProcess(_env(sqlite_url, fake_github, backends_dir), tmp_path / "first.log", fresh=fresh).start()
    try:
        assert os.readlink(f"/proc/{first.process.pid}/cwd") == str(CHECKOUT)
        assert first.post("push", push_payload(), "delivery-1").status_code == 202  # its settings: its secret
        first.process.terminate()  # uvicorn shuts down gracefully, then ends by the signal it caught
        assert first.process.wait(15) == -signal.SIGTERM
    finally:
        first.stop()
    log = (tmp_path / "first.log").read_text()
    assert f"Uvicorn running on http://127.0.0.1:{first.port}" in log and "Finished server process" in log
    second = RelayProcess(_env(sqlite_url, fake_github, backends_dir), tmp_path / "second.log", fresh=fresh).start()
    second.kill()
    assert second.process.returncode == -signal.SIGKILL
    second.process.send_signal(signal.SIGTERM)  # reaped: not sent to whatever process has that pid now
