"""POST /github/callback over real HTTP against a served relay (SQLite and PostgreSQL): the happy path
with OIDC and with a static token, per-test results stored, and every refusal with its status and code."""

import json

import httpx

from relay.store.per_test_results import FAILING_OUTCOMES
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import AUDIENCE, REPOS, report


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code, body
    return body["detail"]


def test_oidc_run_through_its_life(database_url, results_relay, oidc_issuer):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(7)
    nonce = drive.nonce("l2", delivery)
    token = oidc_issuer.mint(REPOS["l2"], AUDIENCE, run_id=9001, run_attempt=1)
    started = drive.start("l2", nonce, run_id=9001, auth=f"Bearer {token}")
    assert started.status_code == 200, started.text
    assert started.json()["state"] == "in_progress" and started.json()["previous_state"] == "dispatched"
    done = drive.complete("l2", nonce, "failure", run_id=9001, auth=f"Bearer {token}")
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["state"], body["conclusion"], body["tests_recorded"]) == ("completed", "failure", 2)
    assert body["queue_seconds"] is not None and body["execution_seconds"] is not None
    run = relay.store.run(body["run"])
    assert (run.run_id, run.run_attempt, run.pr_number, run.head_sha) == (9001, 1, 7, "a" * 40)
    assert run.summary["suites"]["collectives"]["failed"] == 1
    failures = relay.store.test_results([run.id], ["failed"])
    assert [(f.test_id, f.message) for f in failures] == [("collectives::test_broadcast", "AssertionError: rank 1 got 0")]


def test_static_token_and_outcome_states(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(8)
    nonce = drive.nonce("l4", delivery)
    assert drive.start("l4", nonce).status_code == 200
    cancelled = drive.complete("l4", nonce, "cancelled", with_report=False)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"


def test_an_unexpected_pass_is_stored_as_such_and_never_counted_as_a_failure(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(15))
    assert drive.start("l4", nonce).status_code == 200
    body = report("l4", [("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", ""),
                         ("conformance/suites/test_collectives.py::test_broadcast", "passed", "")])
    body["schema_version"] = "1.1"
    entry = {"match": "collectives::test_broadcast", "reason": "fixed upstream", "link": "https://example.org/9"}
    body["tests"][1].update(outcome="unexpected_pass", message="passed: known failure on l4: fixed upstream",
                            known_failure=entry)
    body["summary"].update(passed=1, unexpected_passes=1)
    done = drive.complete("l4", nonce, "success", report_body=body)
    assert done.status_code == 200, done.text
    assert (done.json()["state"], done.json()["conclusion"], done.json()["tests_recorded"]) == ("completed", "success", 2)
    (run,) = relay.store.runs(backend="l4", pr_number=15)
    assert run.summary["counts"]["unexpected_passes"] == 1 and run.summary["counts"]["failed"] == 0
    (stored,) = relay.store.test_results([run.id], ["unexpected_pass"])
    assert (stored.test_id, stored.message) == ("collectives::test_broadcast", "passed: known failure on l4: fixed upstream")
    assert relay.store.test_results([run.id], FAILING_OUTCOMES) == []
    assert relay.parts.results.reporting.wait_idle(10)
    final = [s for s in relay.fake.statuses if s["context"] == "crcr/l4"][-1]
    assert final["state"] == "success" and "1 passed, 1 unexpected passes" in final["description"]


def test_second_attempt_of_a_downstream_run_is_a_new_run(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(9))
    assert drive.start("l2", nonce, attempt=1).status_code == 200
    assert drive.complete("l2", nonce, "failure", attempt=1).status_code == 200
    second = drive.start("l2", nonce, attempt=2)
    assert second.status_code == 200 and second.json()["previous_state"] == "dispatched"
    assert len(relay.store.runs(backend="l2", pr_number=9)) == 2


def test_refusals_of_the_state_machine(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(10))
    detail = error_of(drive.complete("l2", nonce, "success"), 409, "completed_before_in_progress")
    assert "in_progress" in detail
    assert drive.start("l2", nonce).status_code == 200
    error_of(drive.start("l2", nonce), 409, "replay")
    assert drive.complete("l2", nonce, "success").status_code == 200
    error_of(drive.complete("l2", nonce, "success"), 409, "already_completed")
    error_of(drive.start("l2", nonce), 409, "already_completed")
    # The refused callbacks wrote nothing: one run, two recorded tests.
    (run,) = relay.store.runs(backend="l2", pr_number=10)
    assert run.state == "completed" and len(relay.store.test_results([run.id])) == 2


def test_unknown_nonce_and_nonce_of_another_backend(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce_l4 = drive.nonce("l4", drive.open_pr(11))
    error_of(drive.start("l2", "x" * 32), 404, "unknown_nonce")
    detail = error_of(drive.start("l2", nonce_l4), 403, "nonce_of_other_backend")
    assert "'l4'" in detail and "'l2'" in detail


def test_oidc_token_of_another_run_is_refused(database_url, results_relay, oidc_issuer):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(12))
    token = oidc_issuer.mint(REPOS["l2"], AUDIENCE, run_id=1)
    detail = error_of(drive.start("l2", nonce, run_id=2, auth=f"Bearer {token}"), 403, "run_mismatch")
    assert "run 1" in detail and "run 2" in detail
    detail = error_of(drive.start("l2", nonce, run_id=1, attempt=2, auth=f"Bearer {token}"), 403, "run_mismatch")
    assert "attempt 1" in detail and "attempt 2" in detail


def test_auth_refusals(database_url, results_relay, oidc_issuer):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l1", drive.open_pr(13))
    error_of(drive.start("l1", nonce), 403, "level_too_low")
    error_of(drive.start("l2", nonce, auth=""), 401, "missing_credentials")
    expired = oidc_issuer.mint(REPOS["l2"], AUDIENCE, now=0)
    error_of(drive.start("l2", nonce, auth=f"Bearer {expired}"), 401, "token_expired")


def test_body_and_report_validation(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(14))
    error_of(drive.callback({}, backend="l2", content=b"{not json"), 400, "malformed_json")
    detail = error_of(drive.callback({"nonce": nonce, "state": "started", "run_id": 1}, backend="l2"), 400, "invalid_callback")
    assert "state" in detail
    detail = error_of(drive.callback({"nonce": nonce, "state": "completed", "run_id": 1}, backend="l2"), 400, "invalid_callback")
    assert "conclusion" in detail
    assert drive.start("l2", nonce).status_code == 200
    bad = report("l2")
    bad["tests"][1]["outcome"] = "exploded"
    detail = error_of(drive.complete("l2", nonce, report_body=bad), 400, "invalid_report")
    assert "tests/1/outcome" in detail
    detail = error_of(drive.complete("l2", nonce, report_body=report("l4")), 400, "report_backend_mismatch")
    assert "'l4'" in detail
    (run,) = relay.store.runs(backend="l2", pr_number=14)
    assert run.state == "in_progress"  # nothing of the invalid reports was kept


def test_content_type_and_size_cap(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, callback_max_bytes=2048)
    nonce = drive.nonce("l2", drive.open_pr(15))
    error_of(drive.callback({}, backend="l2", content=b"a=b", headers={"Content-Type": "text/plain"}), 415,
             "unsupported_media_type")
    big = report("l2", [(f"conformance/suites/test_x.py::test_{i}", "passed", "") for i in range(50)])
    body = json.dumps({"nonce": nonce, "state": "completed", "run_id": 1, "conclusion": "success", "report": big})
    detail = error_of(drive.callback({}, backend="l2", content=body.encode()), 413, "payload_too_large")
    assert "RELAY_CALLBACK_MAX_BYTES" in detail


def test_rate_limit_per_repository(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, callback_rate_per_minute=1, callback_rate_burst=2)
    delivery = drive.open_pr(16)
    nonce2, nonce3 = drive.nonce("l2", delivery), drive.nonce("l3", delivery)
    assert drive.start("l2", nonce2).status_code == 200
    assert drive.complete("l2", nonce2, "success").status_code == 200
    limited = drive.start("l2", nonce2, run_id=77)
    error_of(limited, 429, "rate_limited")
    assert int(limited.headers["Retry-After"]) >= 1
    assert drive.start("l3", nonce3).status_code == 200  # another repository has its own budget


def test_expired_nonce(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, nonce_ttl_hours=1e-9)
    nonce = drive.nonce("l2", drive.open_pr(17))
    from relay.results.sweeper import Sweeper

    counts = Sweeper(relay.store, start_timeout_seconds=3600, run_timeout_seconds=3600,
                     nonce_ttl_seconds=1e-6).sweep_once()
    assert counts["nonce_expired"] >= 1
    error_of(drive.start("l2", nonce), 410, "nonce_expired")
