"""Poison input, on both stores: text PostgreSQL cannot hold (U+0000) and values longer than their column
never stop a worker, wedge a run or turn into a 503. U+0000 is stored as U+FFFD (one rule, both stores);
a value over its bound is a 4xx naming the field; a row a background pass cannot handle is set aside."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from relay.testing import loopback_client
from tests.relay.dispatch.test_reruns import post_and_handle, retest_comment
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

NUL, REPLACEMENT = "\x00", "\ufffd"


def test_a_report_holding_nul_is_stored_with_the_replacement_character(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(51))
    assert drive.start("l2", nonce).status_code == 200
    body = report("l2", [("conformance/suites/test_x.py::test_nul\x00", "failed", f"rank 1 wrote {NUL}{NUL} and died")])
    done = drive.complete("l2", nonce, "failure", report_body=body)
    assert done.status_code == 200, done.text
    (result,) = relay.store.test_results([done.json()["run"]])
    assert result.message == f"rank 1 wrote {REPLACEMENT}{REPLACEMENT} and died"
    assert result.test_id.endswith(f"test_nul{REPLACEMENT}")
    (run,) = relay.store.runs(backend="l2", pr_number=51)
    assert run.state == "completed"


def test_a_big_report_holding_nul_is_stored_and_leaves_no_invisible_rows(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(52))
    assert drive.start("l2", nonce).status_code == 200
    tests = [(f"conformance/suites/test_x.py::test_{i}", "failed", f"out {NUL} {i}") for i in range(2500)]
    done = drive.complete("l2", nonce, "failure", report_body=report("l2", tests))
    assert done.status_code == 200, done.text
    assert done.json()["tests_recorded"] == 2500
    with relay.store.engine.connect() as connection:  # every row stored is visible: none left over
        assert connection.execute(text("SELECT count(*) FROM test_results")).scalar_one() == 2500


def test_a_torch_version_over_its_column_is_400_naming_the_field_on_both_stores(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(53))
    assert drive.start("l2", nonce).status_code == 200
    body = report("l2")
    body["torch"]["version"] = "2.13.0+" + "x" * 200
    refused = drive.complete("l2", nonce, "failure", report_body=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == "invalid_report" and "torch/version" in refused.json()["detail"]
    done = drive.complete("l2", nonce, "failure")  # the honest retry finishes the run
    assert done.status_code == 200, done.text


def test_a_value_the_database_refuses_is_422_naming_the_field_never_503(postgres_url):
    from relay.store import Store, StoreRefused
    from tests.relay.helpers import new_delivery

    store = Store(postgres_url)
    store.migrate()
    try:
        delivery = new_delivery("d-long")
        long = delivery.__class__(**{**delivery.__dict__, "event": "e" * 65})
        with pytest.raises(StoreRefused, match=r"deliveries\.event \(at most 64 characters, got 65\)"):
            store.record_delivery(long)
        assert store.delivery("d-long") is None
    finally:
        store.close()


def test_nul_in_a_pr_title_reaches_the_run_rows_and_the_callbacks_work(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(54, title=f"poison{NUL}title")
    assert relay.store.quarantined(10) == []
    nonce = drive.nonce("l2", delivery)
    assert drive.start("l2", nonce).status_code == 200
    assert drive.complete("l2", nonce, "success").status_code == 200
    (run,) = relay.store.runs(backend="l2", pr_number=54)
    assert run.title == f"poison{REPLACEMENT}title" and run.state == "completed"


def test_a_retest_comment_holding_nul_is_ignored_and_later_reruns_still_work(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    delivery = drive.open_pr(55)
    nonce = drive.nonce("l2", delivery)
    drive.start("l2", nonce)
    drive.complete("l2", nonce, "failure")
    _, poisoned = post_and_handle(relay, "issue_comment", retest_comment("/retest", f"MEMBER{NUL}", 55))
    assert poisoned.outcome == "ignored" and f"MEMBER{REPLACEMENT}" in poisoned.reason
    _, honest = post_and_handle(relay, "issue_comment", retest_comment("/retest l2", "MEMBER", 55))
    assert (honest.outcome, honest.backends) == ("dispatched", ("l2",))
    assert relay.parts.results.problems() == []
    ready = loopback_client().get(f"{relay.url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text


@pytest.mark.parametrize("path", ["/api/tests/%00x/history", "/api/tests/failing?backend=%00", "/backends/l2%00"])
def test_nul_in_a_url_is_never_a_503(database_url, results_relay, path):  # noqa: F811
    relay, _drive = results_relay(database_url)
    answer = loopback_client().get(f"{relay.url}{path}", timeout=10)
    assert answer.status_code in (200, 404), (answer.status_code, answer.text)


def test_the_rule_is_the_same_for_a_lookup_and_a_write(store):
    from relay.store import storable_text

    assert storable_text.storable(f"a{NUL}b") == f"a{REPLACEMENT}b"
    assert storable_text.storable(7) == 7 and storable_text.storable("plain") == "plain"
    assert json.loads(json.dumps({"k": NUL}))["k"] == NUL  # JSON itself keeps it: the store is where it changes


def test_a_row_set_aside_shows_on_the_dashboard_and_metrics_and_an_operator_retries_it(
        database_url, results_relay, results_backends, monkeypatch, capsys):  # noqa: F811
    from relay.cli import main
    from relay.store import NewDelivery
    from tests.relay.helpers import UPSTREAM

    relay, _drive = results_relay(database_url, rerun_poll_seconds=3600)
    # The passes below are run by hand. The relay's own re-run worker runs its first pass at start: on a loaded
    # machine that pass came after the first retry and set the row aside again before the second.
    relay.parts.results.reruns.stop()
    relay.store.record_delivery(NewDelivery(
        delivery_id="broken-request", event="issue_comment", action="created", repository=UPSTREAM,
        outcome="stored", summary={}, payload="[1, 2]"))  # a payload that is not an object: handling it raises
    relay.parts.results.reruns.poll_once()
    (entry,) = relay.store.quarantined()
    assert (entry.worker, entry.subject) == ("re-runs", "delivery broken-request")
    assert relay.parts.results.problems() == []  # set aside, so the watcher is not failing
    overview = loopback_client().get(f"{relay.url}/api/overview", timeout=10).json()
    assert overview["set_aside"] == {"re-runs": 1}
    assert "relay quarantined retry" in loopback_client().get(f"{relay.url}/", timeout=10).text
    assert 'relay_quarantined_rows{worker="re-runs"} 1.0' in loopback_client().get(f"{relay.url}/metrics", timeout=10).text

    for name, value in {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "t", "RELAY_DATABASE_URL": database_url,
                        "RELAY_BACKENDS_DIR": str(results_backends)}.items():
        monkeypatch.setenv(name, value)
    assert main(["quarantined", "list"]) == 0
    assert "re-runs  delivery broken-request  AttributeError" in capsys.readouterr().out
    assert main(["quarantined", "retry", "re-runs", "delivery broken-request"]) == 0
    assert "released; the next pass tries it again" in capsys.readouterr().out
    assert main(["quarantined", "retry", "re-runs", "delivery broken-request"]) == 1
    assert "'delivery broken-request' is not set aside" in capsys.readouterr().err
    assert relay.store.quarantined() == []
    relay.parts.results.reruns.poll_once()  # tried again: it fails the same way and is set aside again
    assert [e.subject for e in relay.store.quarantined()] == ["delivery broken-request"]


def test_two_passes_setting_the_same_row_aside_at_once_both_go_on(store, database_url):
    """Two passes (two threads, two replicas) that fail on the same row quarantine it at once: the second
    waits on the first's uncommitted entry, then keeps it and commits its own work (no unique violation)."""
    import datetime as dt
    import threading

    from sqlalchemy.orm import Session

    from relay.store import quarantine

    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite lets one writer in at a time: the second pass cannot overlap the first")
    now = dt.datetime(2026, 1, 1)
    first, second = Session(store.engine), Session(store.engine)
    errors: list[BaseException] = []
    first.begin()
    quarantine.add(first, "re-runs", "delivery d1", "AttributeError: first", now)
    first.flush()

    def other_pass() -> None:
        try:
            with second.begin():
                quarantine.add(second, "re-runs", "delivery d1", "AttributeError: second", now)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    racer = threading.Thread(target=other_pass)
    racer.start()
    racer.join(1.0)
    assert racer.is_alive(), "the second pass should wait on the first's uncommitted entry"
    first.commit()
    racer.join(30)
    assert errors == []
    with Session(store.engine) as reader:
        assert [(v.subject, v.error) for v in quarantine.list_views(reader, 10)] == [("delivery d1", "AttributeError: first")]
    first.close()
    second.close()
