"""Background passes work row by row: a row that cannot be handled is quarantined with its error (shown
in /api/quarantine and /metrics) and every other row is still handled; a worker whose passes keep
failing makes /readyz say so, and health returns once the worker recovers."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from relay.store import NewDelivery, NewDispatch
from relay.store.database import normalise_url
from relay.testing import loopback_client
from tests.relay.conftest import wait_until
from tests.relay.helpers import UPSTREAM
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401


def _sent_pull_request(relay, delivery_id: str, title: str, backend: str = "l2") -> int:
    """A pull_request.opened delivery (with ``title`` in its summary), sent by the relay's dispatcher."""
    relay.store.record_delivery(
        NewDelivery(delivery_id=delivery_id, event="pull_request", action="opened", repository=UPSTREAM,
                    outcome="dispatched", summary={"title": title, "number": 9}),
        [NewDispatch(backend=backend, repository=f"org/{backend}-ci", event_type="pull_request.opened", nonce=f"n-{delivery_id}",
                     client_payload={"event": "pull_request", "action": "opened", "repository": UPSTREAM,
                                     "pull_request": {"number": 9}, "head": {"sha": "a" * 40, "ref": "f"}})],
    )
    relay.parts.dispatcher.wake()
    (row,) = wait_until(lambda: [d for d in relay.store.dispatches(delivery_id) if d.state == "sent"], what="the dispatch sent")
    return row.id


def test_a_run_row_that_cannot_be_stored_is_quarantined_and_the_dispatch_still_sent(database_url, results_relay):  # noqa: F811
    relay, _drive = results_relay(database_url)
    bad = _sent_pull_request(relay, "bad-title", "\ud800")  # a lone surrogate: no database can store it as text
    good = _sent_pull_request(relay, "good-title", "Fix things")
    assert {d.id: d.state for d in relay.store.dispatches() if d.id in (bad, good)} == {bad: "sent", good: "sent"}
    assert [r.dispatch_id for r in relay.store.runs()] == [good]
    (entry,) = relay.store.quarantined()
    assert (entry.worker, entry.subject) == ("run_rows", f"dispatch {bad}")
    assert "surrogate" in entry.error
    later = _sent_pull_request(relay, "later", "More fixes", backend="l3")  # later rows are still written
    assert sorted(r.dispatch_id for r in relay.store.runs()) == [good, later]
    api = loopback_client().get(f"{relay.url}/api/quarantine", timeout=10).json()
    assert [(e["worker"], e["subject"]) for e in api] == [("run_rows", f"dispatch {bad}")]
    assert "surrogate" in api[0]["error"]
    assert 'relay_quarantined_rows{worker="run_rows"} 1.0' in loopback_client().get(f"{relay.url}/metrics", timeout=10).text
    assert loopback_client().get(f"{relay.url}/readyz", timeout=10).status_code == 200  # handled: set aside, not failing


def test_a_worker_whose_passes_keep_failing_makes_readyz_say_so(database_url, results_relay):  # noqa: F811
    relay, _drive = results_relay(database_url, sweeper_enabled=True, sweep_interval_seconds=0.05)
    engine = create_engine(normalise_url(database_url))
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE runs RENAME TO runs_gone"))
        health = wait_until(lambda: (lambda r: r if r.status_code == 503 else None)(loopback_client().get(f"{relay.url}/readyz", timeout=10)),
                            what="readyz reporting the failing sweeper")
        body = health.json()
        assert body["status"] == "worker_failing" and "relay-sweeper" in body["detail"], body
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE runs_gone RENAME TO runs"))
        wait_until(lambda: loopback_client().get(f"{relay.url}/readyz", timeout=10).status_code == 200, what="health after the fix")
    finally:
        engine.dispose()
