"""/readyz, /metrics and structured logs."""

from __future__ import annotations

import json
import logging

import pytest

from relay.logs import JsonFormatter
from relay.testing import Fault
from relay.testing import loopback_client
from tests.relay.helpers import pr_payload, push_payload


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in metrics")


def test_readyz_reports_the_store(relay_factory, database_url):
    relay = relay_factory(database_url)
    assert loopback_client().get(f"{relay.url}/readyz").json() == {"status": "ok"}


def test_readyz_is_503_when_the_store_is_unreachable_while_healthz_stays_live(relay_factory, sqlite_url):
    from relay.store import Store

    relay = relay_factory(sqlite_url)
    working = relay.parts.store
    relay.parts.store = Store("postgresql://relay:hunter2@127.0.0.1:1/nowhere")  # nothing listens on port 1
    try:
        answer = loopback_client().get(f"{relay.url}/readyz")
        live = loopback_client().get(f"{relay.url}/healthz")
    finally:
        relay.parts.store.close()
        relay.parts.store = working
    assert answer.status_code == 503 and answer.json()["status"] == "unavailable"
    assert "127.0.0.1:1" in answer.json()["detail"] and "hunter2" not in answer.json()["detail"]
    # Liveness asks nothing of the store: restarting the relay would not bring the database back.
    assert live.status_code == 200 and live.json() == {"status": "ok"}


def test_metrics_count_events_dispatches_retries_and_failures(relay_factory, database_url):
    relay = relay_factory(database_url)
    relay.fake.script(Fault.server_error(), repository="org/l1-ci")
    relay.fake.script(Fault.not_found(), repository="org/l2-ci")
    relay.post("pull_request", pr_payload(), delivery="m-1")
    relay.post("pull_request", pr_payload(), delivery="m-1")
    relay.post("ping", {"zen": "z"})
    relay.post("star", {"repository": {"full_name": "pytorch/pytorch"}})
    relay.wait_settled()
    text = loopback_client().get(f"{relay.url}/metrics").text
    assert _metric(text, "relay_webhook_events_total", event="pull_request", outcome="queued") == 1
    assert _metric(text, "relay_webhook_events_total", event="pull_request", outcome="duplicate") == 1
    assert _metric(text, "relay_webhook_events_total", event="ping", outcome="pong") == 1
    assert _metric(text, "relay_webhook_events_total", event="star", outcome="ignored") == 1
    assert _metric(text, "relay_dispatches_sent_total") == 3
    assert _metric(text, "relay_dispatch_retries_total", reason="server_or_network") == 1
    assert _metric(text, "relay_dispatch_failures_total", reason="permanent_404") == 1
    assert _metric(text, "relay_outbox_dispatches", state="sent") == 3
    assert _metric(text, "relay_outbox_dispatches", state="failed") == 1
    assert _metric(text, "relay_dispatch_request_seconds_count", outcome="sent") == 3
    assert _metric(text, "relay_dispatch_delay_seconds_count") == 3


def test_json_log_lines_carry_fields():
    record = logging.LogRecord("relay.dispatch", logging.INFO, __file__, 1, "dispatched", None, None)
    record.delivery, record.backend = "d-1", "cpu"
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "dispatched" and line["delivery"] == "d-1" and line["backend"] == "cpu"
    assert line["level"] == "info" and line["ts"].endswith("Z")


@pytest.mark.parametrize("secret", ["test-secret"])
def test_secrets_are_not_logged(relay_factory, sqlite_url, caplog, secret):
    caplog.set_level(logging.DEBUG, logger="relay")
    relay = relay_factory(sqlite_url, log_level="DEBUG")
    relay.post("push", push_payload())
    relay.post("push", push_payload(), secret="wrong")
    relay.wait_settled()
    assert caplog.records
    assert all(secret not in r.getMessage() and "test-token" not in str(r.__dict__) for r in caplog.records)
