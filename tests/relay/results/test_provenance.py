"""Provenance of the tested torch (conformance/provenance.py, as the relay applies it) and supersede, against a served relay and the fake
GitHub: a report of another torch is stored as mismatched, shown on the run and PR pages and in the
API, and never reported as a pass (L4 failure, L3 neutral, both saying which torch and which commit);
a matching one passes; an older run of a PR that never started is cancelled as superseded when the
newer one reports in_progress, and does not count in the level review."""

from __future__ import annotations

import datetime as dt

import pytest

from relay.levels.review import week_stats
from conformance.provenance import Provenance, check
from relay.testing import loopback_client
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

HEAD = "a" * 40
OTHER = "b" * 40
LABEL = "ciflow/crcr/l3"


@pytest.mark.parametrize("tested,expected,verdict", [
    (HEAD, HEAD, Provenance.matched),
    (HEAD.upper(), HEAD, Provenance.matched),
    (HEAD[:12], HEAD, Provenance.matched),       # an abbreviated git_version
    (HEAD, HEAD[:7], Provenance.matched),
    (HEAD[:6], HEAD, Provenance.unknown),        # too short to name one commit
    (OTHER, HEAD, Provenance.mismatched),
    ("a" * 12 + "c" * 28, HEAD, Provenance.mismatched),
    ("Unknown", HEAD, Provenance.unknown),       # torch built without git metadata
    ("", HEAD, Provenance.unknown),
])
def test_check(tested, expected, verdict):
    assert check(tested, expected).verdict is verdict


def with_torch(backend: str, git_version: str) -> dict:
    body = report(backend, [("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", "")])
    body["torch"]["git_version"] = git_version
    return body


def settle(relay):
    assert relay.parts.results.reporting.wait_idle(30)


def statuses(fake, context):
    return [s for s in fake.statuses if s["context"] == context]


def test_another_torch_is_never_a_pass_upstream(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(31, labels=(LABEL,), head_sha=HEAD)
    for backend in ("l3", "l4"):
        nonce = drive.nonce(backend, delivery)
        assert drive.start(backend, nonce).status_code == 200
        done = drive.complete(backend, nonce, "success", report_body=with_torch(backend, OTHER))
        assert done.status_code == 200, done.text
    settle(relay)
    l4 = statuses(relay.fake, "crcr/l4")[-1]
    assert l4["state"] == "failure"
    assert l4["description"].startswith("wrong torch: tested torch built from bbbbbbbbbbbb, expected aaaaaaaaaaaa")
    l3 = statuses(relay.fake, "crcr/l3")[-1]
    assert l3["state"] == "success"  # statuses have no neutral: L3 cannot block
    assert l3["description"].startswith("neutral (non-blocking): wrong torch: tested torch built from bbbbbbbbbbbb")

    (run,) = relay.store.runs(backend="l4", pr_number=31)
    assert (run.conclusion, run.provenance, run.torch_git_version) == ("success", "mismatched", OTHER)
    api = loopback_client().get(f"{relay.url}/api/runs/{run.id}").json()
    assert api["provenance"] == "mismatched" and api["torch_git_version"] == OTHER
    assert "expected aaaaaaaaaaaa" in api["provenance_problem"]
    assert "wrong torch: tested torch built from bbbbbbbbbbbb" in loopback_client().get(f"{relay.url}/runs/{run.id}").text
    pr = loopback_client().get(f"{relay.url}/api/prs/31").json()
    assert pr["runs"]["l4"][0]["provenance"] == "mismatched"
    assert pr["failing"] == [] and pr["head_sha"] is None  # a run of another torch is not compared
    assert "wrong torch" in loopback_client().get(f"{relay.url}/prs/31").text


def test_check_run_of_another_torch_says_which(database_url, results_relay, app_mode, wait):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode)
    nonce = drive.nonce("l4", drive.open_pr(32, head_sha=HEAD))
    drive.start("l4", nonce)
    drive.complete("l4", nonce, "success", report_body=with_torch("l4", "Unknown"))
    settle(relay)
    (check_run,) = wait(lambda: [c for c in relay.fake.check_runs.values()
                                 if c["name"] == "crcr/l4" and c["status"] == "completed"], timeout=30,
                         what="the completed check run")
    assert (check_run["status"], check_run["conclusion"]) == ("completed", "failure")
    assert "**Not a result for this commit**: ` unknown torch: the report's torch.git_version is 'Unknown'" \
        in check_run["output"]["summary"]


def test_the_dispatched_torch_passes(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(33, head_sha=HEAD))
    drive.start("l4", nonce)
    drive.complete("l4", nonce, "success", report_body=with_torch("l4", HEAD))
    settle(relay)
    assert statuses(relay.fake, "crcr/l4")[-1]["state"] == "success"
    (run,) = relay.store.runs(backend="l4", pr_number=33)
    assert (run.provenance, run.provenance_problem) == ("matched", None)
    assert "the tested torch is the dispatched commit" in loopback_client().get(f"{relay.url}/runs/{run.id}").text


def test_older_run_that_never_started_is_superseded(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    first = drive.open_pr(34, head_sha=HEAD)  # each dispatch's run row is written when it is sent
    second = drive.open_pr(34, head_sha=OTHER, action="synchronize", updated_at="2024-05-01T11:00:00Z")
    older, = [r for r in relay.store.runs(backend="l4", pr_number=34) if r.head_sha == HEAD]
    assert older.state == "dispatched"
    assert drive.start("l4", drive.nonce("l4", second)).status_code == 200
    settle(relay)
    runs = {r.head_sha: r for r in relay.store.runs(backend="l4", pr_number=34)}
    assert (runs[HEAD].state, runs[HEAD].reason) == ("cancelled", "superseded")
    assert runs[OTHER].state == "in_progress"
    assert statuses(relay.fake, "crcr/l4")[0]["state"] == "pending"
    # Its late in_progress is refused by the state machine.
    late = drive.start("l4", drive.nonce("l4", first), run_id=5002)
    assert late.status_code == 409 and late.json()["error"] == "already_cancelled"
    # A superseded run never counts against the backend's level.
    stats = week_stats("l4", relay.store.runs(backend="l4"), dt.datetime(2000, 1, 1), dt.datetime(2100, 1, 1))
    assert stats.runs == 0
