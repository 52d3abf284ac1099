"""Run rows come from the dispatcher: the transaction that marks a dispatch sent creates the run it
starts (so the queued check appears upstream at once), and a sent ``pull_request.closed`` cancels the
PR's open runs of that backend (and upstream hears of it), on a served relay."""

from tests.relay.helpers import pr_payload
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401


def test_a_sent_dispatch_has_its_run_and_upstream_shows_it_queued(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(47)
    runs = relay.store.runs(pr_number=47)
    assert sorted(r.backend for r in runs) == ["l1", "l2", "l3", "l4"]
    assert {(r.state, r.delivery_id, r.title) for r in runs} == {("dispatched", delivery, "Fix things")}
    sent = {d.id: d.sent_at for d in relay.store.dispatches(delivery)}
    assert all(r.dispatched_at == sent[r.dispatch_id] for r in runs)
    assert relay.parts.results.reporting.wait_idle(10)
    (queued,) = [s for s in relay.fake.statuses if s["context"] == "crcr/l4"]
    assert queued["state"] == "pending" and queued["description"].startswith("queued")


def test_a_sent_close_cancels_the_open_runs_of_the_pr_and_upstream_hears_of_it(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(44))
    # Each status reported before the next change: a change that comes first replaces the one not yet sent.
    assert relay.parts.results.reporting.wait_idle(10)  # queued
    assert drive.start("l4", nonce).status_code == 200
    assert relay.parts.results.reporting.wait_idle(10)  # running
    closed = pr_payload("closed", number=44, updated_at="2024-05-01T12:00:00Z")
    closed["pull_request"]["state"] = "closed"
    assert relay.post("pull_request", closed).status_code == 202
    relay.wait_settled()
    assert {(r.state, r.reason) for r in relay.store.runs(pr_number=44)} == {("cancelled", "pull_request_closed")}
    assert relay.parts.results.reporting.wait_idle(10)
    shown = [s for s in relay.fake.statuses if s["context"] == "crcr/l4"]
    assert [s["state"] for s in shown] == ["pending", "pending", "error"] and "cancelled" in shown[-1]["description"]
    late = drive.complete("l4", nonce, "success")
    assert late.status_code == 409 and late.json()["error"] == "already_cancelled"
