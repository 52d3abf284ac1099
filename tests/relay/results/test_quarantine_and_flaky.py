"""Quarantined tests (the descriptor's ``relay.quarantine``) never decide an upstream check, and the
summary always counts them; flaky tests (a pass and a failure for one backend on one torch commit)
are marked with their evidence on the test page and in the API. Real store, fake GitHub over HTTP."""

import datetime as dt

import pytest
import yaml

from conformance.descriptors import DescriptorError, load_descriptor
from relay.store.base import utcnow
from relay.testing import loopback_client
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

BROADCAST = "conformance/suites/test_collectives.py::test_broadcast"
GATHER = "conformance/suites/test_collectives.py::test_all_gather"


def quarantine(backends, backend, *entries):
    path = backends / f"{backend}.yaml"
    data = yaml.safe_load(path.read_text())
    data["relay"]["quarantine"] = list(entries)
    path.write_text(yaml.safe_dump(data))


def entry(match="collectives::test_broadcast", days=30, reason="flaky ring timeout, tracked upstream"):
    return {"match": match, "reason": reason, "expires": (utcnow().date() + dt.timedelta(days=days)).isoformat()}


def settle(relay):
    assert relay.parts.results.reporting.wait_idle(10)


def finish(drive, relay, backend, number, tests, conclusion="failure"):
    nonce = drive.nonce(backend, drive.open_pr(number))
    assert drive.start(backend, nonce).status_code == 200
    assert drive.complete(backend, nonce, conclusion, report_body=report(backend, tests)).status_code == 200
    settle(relay)
    (check,) = [c for c in relay.fake.check_runs.values() if c["name"] == f"crcr/{backend}"
                and c["external_id"] == str(relay.store.runs(backend=backend, pr_number=number)[0].id)]
    return check


def test_only_quarantined_failures_conclude_success_and_are_listed_apart(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    quarantine(results_backends, "l4", entry())
    relay, drive = results_relay(database_url, **app_mode)
    check = finish(drive, relay, "l4", 40, [(GATHER, "passed", ""), (BROADCAST, "failed", "rank 1 got 0")])
    assert (check["status"], check["conclusion"]) == ("completed", "success")
    summary = check["output"]["summary"]
    assert "1 quarantined failure(s) (non-blocking)" in summary and "1 quarantined" in check["output"]["title"]
    assert "Quarantined failing tests (non-blocking; 1):" in summary
    assert "` collectives::test_broadcast ` (failed): quarantined until" in summary
    assert "First failing tests" not in summary  # nothing blocking to list


def test_a_failure_outside_the_quarantine_still_fails_and_both_are_counted(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    quarantine(results_backends, "l4", entry())
    relay, drive = results_relay(database_url, **app_mode)
    check = finish(drive, relay, "l4", 41, [(GATHER, "failed", "short"), (BROADCAST, "failed", "rank 1 got 0")])
    assert check["conclusion"] == "failure"
    summary = check["output"]["summary"]
    assert "First failing tests (1 of 1):" in summary and "collectives::test_all_gather" in summary
    assert "1 quarantined failure(s) (non-blocking)" in summary


def test_an_expired_quarantine_blocks_again_and_the_summary_says_none(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    quarantine(results_backends, "l4", entry(days=-1))
    relay, drive = results_relay(database_url, **app_mode)
    check = finish(drive, relay, "l4", 42, [(BROADCAST, "failed", "rank 1 got 0")])
    assert check["conclusion"] == "failure"
    assert "0 quarantined failure(s) (non-blocking)" in check["output"]["summary"]


def test_a_failure_the_report_counts_but_did_not_record_is_not_excused(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    quarantine(results_backends, "l4", entry())
    relay, drive = results_relay(database_url, **app_mode)
    nonce = drive.nonce("l4", drive.open_pr(43))
    drive.start("l4", nonce)
    body = report("l4", [(BROADCAST, "failed", "rank 1 got 0")])
    body["summary"]["errors"] = 1  # a collection error with no test row of its own
    body["summary"]["total"] = 2
    assert drive.complete("l4", nonce, "failure", report_body=body).status_code == 200
    settle(relay)
    (check,) = [c for c in relay.fake.check_runs.values() if c["name"] == "crcr/l4"]
    assert check["conclusion"] == "failure"


def test_commit_status_counts_quarantined_failures(database_url, results_relay, results_backends):  # noqa: F811
    quarantine(results_backends, "l4", entry())
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(44))
    drive.start("l4", nonce)
    drive.complete("l4", nonce, "failure", report_body=report("l4", [(BROADCAST, "failed", "rank 1 got 0")]))
    settle(relay)
    final = [s for s in relay.fake.statuses if s["context"] == "crcr/l4"][-1]
    assert final["state"] == "success" and "1 quarantined" in final["description"]


def test_a_quarantine_entry_needs_a_reason_and_an_expiry(tmp_path, results_backends):  # noqa: F811
    for broken, field in (({"match": "collectives::x", "reason": "r"}, "expires"),
                          ({"match": "collectives::x", "expires": "2030-01-01"}, "reason"),
                          ({"match": "no-suite", "reason": "r", "expires": "2030-01-01"}, "match")):
        quarantine(results_backends, "l4", broken)
        with pytest.raises(DescriptorError, match=f"quarantine.0.{field}"):
            load_descriptor(results_backends / "l4.yaml")


def test_flaky_tests_carry_their_evidence_on_the_test_page_and_in_the_api(
        database_url, results_relay, results_backends):  # noqa: F811
    quarantine(results_backends, "l3", entry())
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(45))
    for attempt, outcome in ((1, "failed"), (2, "passed")):  # a re-run of the same commit
        run_id = 6001  # the same downstream run, attempted again
        assert drive.start("l2", nonce, run_id=run_id, attempt=attempt).status_code == 200
        assert drive.complete("l2", nonce, "failure" if outcome == "failed" else "success", run_id=run_id,
                              attempt=attempt, report_body=report("l2", [(BROADCAST, outcome, "")])).status_code == 200
    # Another commit where it only failed: not flaky there.
    other = drive.nonce("l2", drive.open_pr(46, head_sha="b" * 40))
    drive.start("l2", other, run_id=6100)
    drive.complete("l2", other, "failure", run_id=6100, report_body=report("l2", [(BROADCAST, "failed", "")],
                                                                           git_version="b" * 40))
    runs = {r.run_attempt: r.id for r in relay.store.runs(backend="l2", pr_number=45)}
    flaky = loopback_client().get(f"{relay.url}/api/tests/flaky").json()
    assert flaky == [{"backend": "l2", "test_id": "collectives::test_broadcast", "torch_commit": "a" * 40,
                      "passed_runs": [runs[2]], "failed_runs": [runs[1]], "last_seen": flaky[0]["last_seen"]}]
    assert loopback_client().get(f"{relay.url}/api/tests/flaky", params={"backend": "l4"}).json() == []
    page = loopback_client().get(f"{relay.url}/api/tests/collectives::test_broadcast").json()
    assert [f["backend"] for f in page["flaky"]] == ["l2"]
    assert [(q["backend"], q["reason"], q["release_proposed"]) for q in page["quarantined"]] == [
        ("l3", "flaky ring timeout, tracked upstream", False)]
    html = loopback_client().get(f"{relay.url}/tests/collectives::test_broadcast").text
    assert "flaky on" in html and f'href="/runs/{runs[1]}"' in html and "until " in html


def test_the_documented_quarantine_entry_loads(tmp_path, results_backends):  # noqa: F811
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "trust-levels.md").read_text()
    block = re.findall(r"```yaml\n(.*?)```", doc, re.S)[1]
    path = results_backends / "l4.yaml"
    data = yaml.safe_load(path.read_text())
    data["relay"] = yaml.safe_load(block)["relay"]
    path.write_text(yaml.safe_dump(data))
    (entry_,) = load_descriptor(path).relay.quarantine
    assert entry_.matches("collectives::test_broadcast[int8]") and entry_.expires == dt.date(2026, 12, 31)
