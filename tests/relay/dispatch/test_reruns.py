"""Re-runs through a served relay: check_run.rerequested, check_suite.rerequested and ``/retest``
comments re-dispatch (same event and commit, fresh nonce); comments by others, and requests for
things that are not ours, are ignored with the reason recorded. Webhooks start from GitHub's real
payloads in ../shared/github-payloads when present (adapted to the upstream repository)."""

import copy
import json
import uuid

import pytest

from relay.dispatch.reruns import parse_retest
from tests.relay.conftest import wait_until
from tests.relay.helpers import PAYLOADS_DIR, UPSTREAM
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import REPOS


def real_or_minimal(name: str, minimal: dict) -> dict:
    path = PAYLOADS_DIR / name
    base = json.loads(path.read_text()) if path.is_file() else {}
    merged = copy.deepcopy(base)
    for key, value in minimal.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key].update(value)
        else:
            merged[key] = value
    merged.setdefault("repository", {})["full_name"] = UPSTREAM
    return merged


APP_ID = 4242  # the app_mode fixture's GitHub App


def check_run_rerequested(run_pk: int, backend: str, head_sha: str = "a" * 40, *, check_run_id: int | None = None,
                          app_id: int = APP_ID) -> dict:
    check = {"name": f"crcr/{backend}", "external_id": str(run_pk), "head_sha": head_sha, "app": {"id": app_id}}
    if check_run_id is not None:
        check["id"] = check_run_id
    return real_or_minimal("check_run__rerequested.payload.json", {
        "action": "rerequested", "sender": {"login": "maintainer"}, "check_run": check,
    })


def reported_check_run(relay, run_pk: int) -> int:
    """The id of the check run the relay created upstream for ``run_pk``."""
    assert relay.parts.results.reporting.wait_idle(10)
    state = relay.store.reported_state(run_pk, "check_run")
    assert state is not None and state.external_id is not None, state
    return state.external_id


def retest_comment(body: str, association: str, number: int) -> dict:
    return real_or_minimal("issue_comment__created.payload.json", {
        "action": "created", "sender": {"login": "someone"},
        "issue": {"number": number, "pull_request": {"url": f"https://api.github.com/repos/{UPSTREAM}/pulls/{number}"}},
        "comment": {"body": body, "author_association": association, "user": {"login": "someone"}},
    })


def post_and_handle(relay, event: str, payload: dict):
    """Post a re-run request and wait until the watcher has handled it. The tests that use this give the
    watcher an hour-long poll: intake's wake is what brings it to the request."""
    delivery = str(uuid.uuid4())
    response = relay.post(event, payload, delivery=delivery)
    assert response.status_code == 202 and response.json()["status"] == "stored", response.text
    request = wait_until(lambda: relay.store.rerun_request(delivery), what="the re-run watcher to handle the request")
    relay.wait_settled()
    return delivery, request


def dispatched_to(relay, backend: str, delivery: str) -> list[dict]:
    return [d["client_payload"] for d in relay.fake.dispatches(REPOS[backend]) if d["client_payload"]["delivery"] == delivery]


def finished_run(drive, backend: str, number: int):
    delivery = drive.open_pr(number)
    nonce = drive.nonce(backend, delivery)
    drive.start(backend, nonce)
    pk = drive.complete(backend, nonce, "failure").json()["run"]
    return delivery, nonce, pk


def test_check_run_rerequested_redispatches_that_backend(database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600, **app_mode)
    first_delivery, first_nonce, run_pk = finished_run(drive, "l4", 31)
    check_id = reported_check_run(relay, run_pk)
    delivery, request = post_and_handle(relay, "check_run", check_run_rerequested(run_pk, "l4", check_run_id=check_id))
    assert (request.outcome, request.backends) == ("dispatched", ("l4",))
    (payload,) = dispatched_to(relay, "l4", delivery)
    assert payload["nonce"] != first_nonce and payload["head"]["sha"] == "a" * 40
    assert payload["pull_request"]["number"] == 31 and len(payload) < 10
    assert dispatched_to(relay, "l2", delivery) == []
    # the new dispatch's nonce is accepted: the re-run can call back
    assert drive.start("l4", payload["nonce"], run_id=6000).status_code == 200


def test_check_suite_rerequested_redispatches_the_backends_with_check_runs(database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600, **app_mode)
    first = drive.open_pr(32, head_sha="e" * 40)
    for backend in ("l2", "l4"):
        drive.start(backend, drive.nonce(backend, first))
    assert relay.parts.results.reporting.wait_idle(10)
    payload = {"action": "rerequested", "check_suite": {"head_sha": "e" * 40, "app": {"id": APP_ID}},
               "repository": {"full_name": UPSTREAM}, "sender": {"login": "maintainer"}}
    foreign = copy.deepcopy(payload)
    foreign["check_suite"]["app"]["id"] = 99
    assert "app 99" in post_and_handle(relay, "check_suite", foreign)[1].reason
    delivery, request = post_and_handle(relay, "check_suite", payload)
    assert (request.outcome, request.backends) == ("dispatched", ("l4",))  # l2 has no check run upstream
    assert dispatched_to(relay, "l4", delivery) and dispatched_to(relay, "l2", delivery) == []


def test_check_run_rerequest_is_refused_unless_the_relay_created_that_check_run(sqlite_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(sqlite_url, rerun_poll_seconds=3600, **app_mode)
    _, _, l4_run = finished_run(drive, "l4", 40)
    _, _, l2_run = finished_run(drive, "l2", 41)
    check_id = reported_check_run(relay, l4_run)
    refusals = {
        "another App's check": (check_run_rerequested(l4_run, "l4", check_run_id=check_id, app_id=99), "app 99"),
        "another backend's run": (check_run_rerequested(l4_run, "l2", check_run_id=check_id), "belongs to backend 'l4'"),
        "a run without our check": (check_run_rerequested(l2_run, "l2", check_run_id=check_id), "no check run"),
        "another check run id": (check_run_rerequested(l4_run, "l4", check_run_id=check_id + 1000), "not the check run"),
        "another head sha": (check_run_rerequested(l4_run, "l4", "f" * 40, check_run_id=check_id), "head"),
        "no external_id": ({**check_run_rerequested(l4_run, "l4", check_run_id=check_id)}, "external_id"),
    }
    refusals["no external_id"][0]["check_run"]["external_id"] = None
    for what, (payload, reason) in refusals.items():
        delivery, request = post_and_handle(relay, "check_run", payload)
        assert request.outcome == "ignored" and reason in request.reason, (what, request.reason)
        assert dispatched_to(relay, "l4", delivery) == [] and dispatched_to(relay, "l2", delivery) == [], what
    delivery, request = post_and_handle(relay, "check_run", check_run_rerequested(l4_run, "l4", check_run_id=check_id))
    assert (request.outcome, request.backends) == ("dispatched", ("l4",))


def test_check_run_rerequest_is_refused_when_the_relay_writes_statuses(sqlite_url, results_relay):  # noqa: F811
    relay, drive = results_relay(sqlite_url, rerun_poll_seconds=3600)
    _, _, run_pk = finished_run(drive, "l4", 42)
    delivery, request = post_and_handle(relay, "check_run", check_run_rerequested(run_pk, "l4", check_run_id=1))
    assert request.outcome == "ignored" and "commit statuses" in request.reason
    assert dispatched_to(relay, "l4", delivery) == []


def test_retest_without_an_issue_number_is_refused(sqlite_url, results_relay):  # noqa: F811
    relay, drive = results_relay(sqlite_url, rerun_poll_seconds=3600)
    finished_run(drive, "l2", 43)
    comment = retest_comment("/retest", "OWNER", 43)
    del comment["issue"]["number"]
    delivery, request = post_and_handle(relay, "issue_comment", comment)
    assert request.outcome == "ignored" and "issue.number" in request.reason
    assert dispatched_to(relay, "l2", delivery) == []


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
def test_retest_by_a_trusted_author(database_url, results_relay, association):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    finished_run(drive, "l2", 33)
    delivery, request = post_and_handle(relay, "issue_comment", retest_comment("/retest l2", association, 33))
    assert (request.outcome, request.backends) == ("dispatched", ("l2",))
    assert len(dispatched_to(relay, "l2", delivery)) == 1 and dispatched_to(relay, "l4", delivery) == []


def test_retest_without_backend_repeats_every_backend_of_the_pr(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    delivery0 = drive.open_pr(34)
    for backend in ("l2", "l3", "l4"):
        drive.start(backend, drive.nonce(backend, delivery0))
    delivery, request = post_and_handle(relay, "issue_comment", retest_comment("/retest\nplease", "MEMBER", 34))
    assert request.backends == ("l1", "l2", "l3", "l4")  # every backend the PR was dispatched to


@pytest.mark.parametrize("association", ["CONTRIBUTOR", "NONE", "FIRST_TIME_CONTRIBUTOR"])
def test_retest_by_others_is_ignored_with_the_reason(database_url, results_relay, association, caplog):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    finished_run(drive, "l2", 35)
    caplog.set_level("INFO", logger="relay.rerun")
    delivery, request = post_and_handle(relay, "issue_comment", retest_comment("/retest", association, 35))
    assert request.outcome == "ignored" and association in request.reason
    assert dispatched_to(relay, "l2", delivery) == []
    assert any("ignored" in r.getMessage() and getattr(r, "reason", "") == request.reason for r in caplog.records)


def test_requests_that_are_not_ours_are_ignored(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    _, _, run_pk = finished_run(drive, "l2", 36)
    foreign = check_run_rerequested(run_pk, "l2")
    foreign["check_run"]["name"] = "lint"
    assert "not one of the relay's" in post_and_handle(relay, "check_run", foreign)[1].reason
    assert "no such backend" in post_and_handle(relay, "issue_comment", retest_comment("/retest nope", "OWNER", 36))[1].reason
    assert "not a /retest" in post_and_handle(relay, "issue_comment", retest_comment("LGTM", "OWNER", 36))[1].reason
    assert "no run" in post_and_handle(relay, "issue_comment", retest_comment("/retest", "OWNER", 999))[1].reason


def test_each_request_acts_once(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600)
    _, _, run_pk = finished_run(drive, "l4", 37)
    delivery, _ = post_and_handle(relay, "issue_comment", retest_comment("/retest l4", "OWNER", 37))
    assert relay.parts.results.reruns.poll_once() == 0
    assert len(dispatched_to(relay, "l4", delivery)) == 1


def test_watcher_thread_handles_requests_by_itself(database_url, results_relay, wait):  # noqa: F811
    relay, drive = results_relay(database_url)
    _, _, run_pk = finished_run(drive, "l4", 38)
    delivery = str(uuid.uuid4())
    assert relay.post("issue_comment", retest_comment("/retest l4", "OWNER", 38), delivery=delivery).status_code == 202
    wait(lambda: dispatched_to(relay, "l4", delivery), what="the re-run dispatch")


@pytest.mark.parametrize("body,expected", [
    ("/retest", (True, None)), ("/retest cuda", (True, "cuda")), ("  /retest rocm  \nthanks", (True, "rocm")),
    ("/retest a b", (False, None)), ("please /retest", (False, None)), ("/retesting", (False, None)), ("", (False, None)),
])
def test_parse_retest(body, expected):
    assert parse_retest(body) == expected
