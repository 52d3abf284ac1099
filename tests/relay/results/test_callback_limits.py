"""Reports always fit (issue 20): the callback URL publishes its limits, an over-size body gets a 413 its
sender can read (not a reset connection), and a run of 10 000 failing tests with long messages reaches
the PR through the real client and ``relay serve``, shortened with its failures first."""

from __future__ import annotations

import http.client
import json
import uuid
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conformance.callback import ALLOW_HTTP_LOOPBACK, build_parser, run_callback
from relay.testing.relay_process import RelayProcess
from relay.testing import loopback_client
from tests.relay.conftest import wait_until
from tests.relay.helpers import SECRET, UPSTREAM, pr_payload
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import REPOS, TOKENS, report


def test_the_callback_url_publishes_its_limits(results_relay, sqlite_url):  # noqa: F811
    relay, _ = results_relay(sqlite_url, callback_max_bytes=1_000_000, callback_max_tests=500,
                             callback_max_message_chars=2_000)
    answer = loopback_client().get(f"{relay.url}/github/callback", timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"max_bytes": 1_000_000, "max_tests": 500, "max_message_chars": 2_000}


def relay_serve(fake_github, folder, backends, **settings: str) -> RelayProcess:
    """``relay serve`` (a real process) on SQLite in ``folder``, sending to ``fake_github``; ``settings``
    are more ``RELAY_*`` variables (the limits are the defaults unless they say otherwise)."""
    env = {"RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_TOKEN": "test-token", "RELAY_GITHUB_API_URL": fake_github.url,
           "RELAY_DATABASE_URL": f"sqlite:///{folder / 'relay.db'}", "RELAY_BACKENDS_DIR": str(backends),
           "RELAY_UPSTREAM_REPO": UPSTREAM, "RELAY_DISPATCH_POLL_SECONDS": "0.05", "RELAY_LOG_LEVEL": "WARNING",
           **settings}
    return RelayProcess(env, folder / "relay.log").start()


@pytest.fixture
def served(fake_github, tmp_path):
    """``relay serve`` with a callback limit of 1 MB."""
    backends = tmp_path / "backends"
    backends.mkdir()
    relay = relay_serve(fake_github, tmp_path, backends, RELAY_CALLBACK_MAX_BYTES="1000000")
    yield relay
    relay.stop()


def test_an_oversized_body_gets_a_413_its_sender_can_read(served):
    # As the callback client sends: urllib, the whole body at once. Unread, it would meet a reset
    # connection (ECONNRESET) instead of the answer, and take that for a network error to retry.
    request = urllib.request.Request(f"{served.url}/github/callback", data=b" " * (12 << 20), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": "Token x"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert json.loads(refused.value.read()) == {
        "error": "payload_too_large",
        "detail": "body of 12582912 bytes exceeds the limit of 1000000 bytes (RELAY_CALLBACK_MAX_BYTES)"}


def test_a_sender_waiting_for_100_continue_gets_the_413_without_sending(served):
    parts = urllib.parse.urlsplit(served.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.putrequest("POST", "/github/callback")
    for key, value in {"Content-Type": "application/json", "Content-Length": str(12 << 20),
                       "Authorization": "Token x", "Expect": "100-continue"}.items():
        connection.putheader(key, value)
    connection.endheaders()  # and no body: a 100 Continue would leave this waiting, not answered
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())["error"]) == (413, "payload_too_large")
    connection.close()


@pytest.fixture
def served_with_backends(fake_github, results_backends, tmp_path):  # noqa: F811
    """``relay serve`` with the results tests' backends (l4 reports on the PR) and the default limits."""
    relay = relay_serve(fake_github, tmp_path, results_backends)
    yield relay
    relay.stop()


def test_ten_thousand_failures_with_long_messages_reach_the_pr_first_failures_named(served_with_backends, fake_github,
                                                                                  tmp_path, capsys):
    relay = served_with_backends  # the default limits: 8 MiB, 20 000 tests, 16 384 characters
    delivery = str(uuid.uuid4())
    assert relay.post("pull_request", pr_payload("opened", number=41), delivery).status_code == 202
    nonce = wait_until(lambda: next((d["client_payload"]["nonce"] for d in fake_github.dispatches(REPOS["l4"])
                                     if d["client_payload"]["delivery"] == delivery), None),
                       timeout=30, what="the dispatch to l4")
    tests = [(f"conformance/suites/test_collectives.py::test_all_reduce[case{i:05d}]", "failed",
              f"case {i}: backend cannot initialise: " + "RuntimeError: device lost " * 120) for i in range(10_000)]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report("l4", tests)))  # head a*40: the report's torch
    assert path.stat().st_size > 3 * 8 * 1024 * 1024  # three times the relay's limit as written
    env = {"RELAY_CALLBACK_URL": f"{relay.url}/github/callback", "NONCE": nonce, "RUN_ID": "7100",
           "RUN_ATTEMPT": "1", "RUN_URL": f"https://github.com/{REPOS['l4']}/actions/runs/7100",
           "RELAY_CALLBACK_TOKEN": TOKENS["l4"], "GITHUB_ACTIONS": "true", ALLOW_HTTP_LOOPBACK: "1"}
    argv = ["--backoff-seconds", "0.05", "completed", "--suite-outcome", "failure", "--job-status", "failure",
            "--report", str(path)]
    assert run_callback(build_parser().parse_args(argv), env) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "::warning::the report was shortened to fit the relay's limits (8388608 bytes, 20000 tests" in out

    (summary,) = loopback_client().get(f"{relay.url}/api/prs/41", timeout=30).json()["runs"]["l4"]
    run = loopback_client().get(f"{relay.url}/api/runs/{summary['run']}", timeout=60).json()
    assert (run["state"], run["conclusion"]) == ("completed", "failure")
    assert run["counts"]["failed"] == 10_000, "the summary counts every test, sent or not"
    assert run["reason"].startswith("the report was shortened to fit the relay's limits")
    stored = run["failures"]
    assert 1_000 < len(stored) <= 10_000 and {f["outcome"] for f in stored} == {"failed"}
    ids = sorted(f["test_id"] for f in stored)
    assert ids[0] == "collectives::test_all_reduce[case00000]", ids[:3]

    def final_status():
        done = [s for s in fake_github.statuses if s["sha"] == "a" * 40 and s["state"] != "pending"]
        return done[-1] if done else None

    wait_until(lambda: final_status() is not None, timeout=30, what="the PR's final status")
    status = final_status()
    assert status["state"] == "failure"
    assert "10000 failed" in status["description"] and "first: collectives::test_all_reduce[case00000]" \
        in status["description"], status["description"]
