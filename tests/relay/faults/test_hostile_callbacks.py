"""Hostile callbacks over real HTTP: deep or invalid JSON, oversized reports (413 with the numbers), and a
nonce that binds exactly one downstream run (only later attempts of that run are new runs)."""

from __future__ import annotations

import json

import pytest

from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report
from tests.relay.results.test_receiver import error_of


@pytest.fixture
def started(results_relay, sqlite_url):  # noqa: F811
    """A relay with one dispatched PR; yields (relay, driver, the l2 nonce)."""
    relay, drive = results_relay(sqlite_url, callback_max_tests=50, callback_max_message_chars=100)
    nonce = drive.nonce("l2", drive.open_pr(21))
    return relay, drive, nonce


def test_deeply_nested_callback_is_400_not_500(started):
    relay, drive, nonce = started
    body = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    detail = error_of(drive.callback({}, backend="l2", content=body), 400, "malformed_json")
    assert "nests deeper" in detail


def test_lone_surrogate_in_a_report_is_400_naming_the_field(started):
    relay, drive, nonce = started
    assert drive.start("l2", nonce).status_code == 200
    body = json.dumps({"nonce": nonce, "state": "completed", "run_id": 5001, "conclusion": "failure",
                       "report": report("l2")}).replace("rank 1 got 0", "\\udc00").encode()
    detail = error_of(drive.callback({}, backend="l2", content=body), 400, "invalid_unicode")
    assert "report.tests.1.message" in detail
    (run,) = relay.store.runs(backend="l2", pr_number=21)
    assert run.state == "in_progress"


def test_too_many_tests_is_413_with_the_numbers(started):
    relay, drive, nonce = started
    assert drive.start("l2", nonce).status_code == 200
    many = report("l2", [(f"conformance/suites/test_x.py::test_{i}", "passed", "") for i in range(51)])
    detail = error_of(drive.complete("l2", nonce, "success", report_body=many), 413, "report_too_large")
    assert "51 tests" in detail and "at most 50" in detail and "RELAY_CALLBACK_MAX_TESTS" in detail
    fifty = report("l2", [(f"conformance/suites/test_x.py::test_{i}", "passed", "") for i in range(50)])
    done = drive.complete("l2", nonce, "success", report_body=fifty)
    assert done.status_code == 200 and done.json()["tests_recorded"] == 50
    assert len(relay.store.test_results([done.json()["run"]])) == 50


def test_too_long_message_is_413_with_the_numbers(started):
    relay, drive, nonce = started
    assert drive.start("l2", nonce).status_code == 200
    long = report("l2", [("conformance/suites/test_x.py::test_a", "failed", "m" * 101)])
    detail = error_of(drive.complete("l2", nonce, report_body=long), 413, "report_too_large")
    assert "tests/0/message" in detail and "101 characters" in detail and "at most 100" in detail
    assert "RELAY_CALLBACK_MAX_MESSAGE_CHARS" in detail


def test_a_nonce_binds_one_downstream_run(started):
    relay, drive, nonce = started
    assert drive.start("l2", nonce, run_id=700).status_code == 200
    detail = error_of(drive.start("l2", nonce, run_id=701), 409, "nonce_bound_to_other_run")
    assert "700" in detail and "701" in detail
    assert drive.complete("l2", nonce, "success", run_id=700).status_code == 200
    for other in range(702, 712):  # a dozen other run ids: none becomes a run
        error_of(drive.start("l2", nonce, run_id=other), 409, "nonce_bound_to_other_run")
    # A later attempt of the bound run is a new run; an attempt not after the known ones is refused.
    again = drive.start("l2", nonce, run_id=700, attempt=3)
    assert again.status_code == 200 and again.json()["previous_state"] == "dispatched"
    error_of(drive.start("l2", nonce, run_id=700, attempt=2), 409, "attempt_not_later")
    runs = relay.store.runs(backend="l2", pr_number=21)
    assert sorted((r.run_id, r.run_attempt) for r in runs) == [(700, 1), (700, 3)]
