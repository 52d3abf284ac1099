"""Unexpected passes are news, not failures (issue 18), end to end: an L4 backend reports on an upstream
PR a run whose only non-passes are known failures that passed; the PR's check is a success that names
the entries the PR fixes; the same report on a push to upstream's main makes the proposals open a pull
request on the descriptor repository that bounds the entry to the torch before the fixed one. Every
request to the fake GitHub is checked against GitHub's REST description."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from relay.github import GitHubClient
from relay.levels.proposals import Proposer, bound_branch
from relay.levels.review import week_stats
from relay.testing.github_openapi import default_description
from relay.trust import LEVEL_CRITERIA, load_allowlist
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import TOKENS, report

pytestmark = pytest.mark.skipif(default_description() is None,
                                reason="GitHub's REST description is not installed, so the fake GitHub could not check "
                                       "the requests: npm install --prefix .octokit @octokit/openapi (.ci/run does), "
                                       "or set GITHUB_OPENAPI_DESCRIPTION")

DESCRIPTORS = "org/descriptors"
MAIN_TORCH = "2.16.0a0+git1a2b3c4"
MATCH = "dtensor_argminmax::test_arg*[*Shard(0)*-dim=-1*-1d*]"
ENTRY = {"match": MATCH, "reason": "DTensor argmax/argmin crash on a sharded 1-D tensor with dim=-1",
         "link": "https://github.com/pytorch/pytorch/issues/12345"}
DESCRIPTOR = """\
name: l4
device_type: cpu
detect: {accelerator: none}
distributed_backend: gloo
capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}
known_failures:
  - match: "%s"
    reason: "%s"   # measured on 2.13.0
    link: %s
  - {match: "collectives::test_*[PREMUL_SUM-*]", reason: "no PREMUL_SUM", link: "https://example.org/gloo"}
relay:
  repository: org/l4-ci
  level: L4
  callback_token_sha256: '%s'
""" % (MATCH, ENTRY["reason"], ENTRY["link"], hashlib.sha256(TOKENS["l4"].encode()).hexdigest())


def fixed_report(git_version: str, torch_version: str) -> dict:
    """Two unexpected passes of one entry and a plain pass: no failure at all."""
    body = report("l4", [
        ("conformance/suites/test_dtensor_argminmax.py::test_argmax[Shard(0)-dim=-1-1d-ties]", "passed", ""),
        ("conformance/suites/test_dtensor_argminmax.py::test_argmin[Shard(0)-dim=-1-1d-ties]", "passed", ""),
        ("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", ""),
    ], git_version=git_version)
    body["schema_version"] = "1.1"
    body["torch"]["version"] = torch_version
    for test in body["tests"][:2]:
        test.update(outcome="unexpected_pass", message=f"passed: known failure on l4: {ENTRY['reason']}",
                    known_failure=ENTRY)
    body["summary"].update(passed=1, unexpected_passes=2)
    return body


def completed_check(relay, wait, sha: str) -> dict:
    (check,) = wait(lambda: [c for c in relay.fake.check_runs.values() if c["name"] == "crcr/l4"
                             and c["head_sha"] == sha and c["status"] == "completed"], timeout=30,
                    what=f"the completed check run on {sha[:7]}")
    return check


def test_a_pr_that_fixes_known_failures_is_told_so_and_main_bounds_the_entry(database_url, results_relay, app_mode,  # noqa: F811
                                                                             results_backends, wait):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode)
    pr_head = "a" * 40
    nonce = drive.nonce("l4", drive.open_pr(81, head_sha=pr_head))
    assert drive.start("l4", nonce).status_code == 200
    done = drive.complete("l4", nonce, "success", report_body=fixed_report(pr_head, "2.16.0a0+gitaaaaaaa"))
    assert done.status_code == 200, done.text
    assert relay.parts.results.reporting.wait_idle(30)

    check = completed_check(relay, wait, pr_head)
    assert check["conclusion"] == "success", "a PR that fixes known failures is not failed for it"
    assert check["output"]["title"] == "crcr/l4: 1 passed, 2 unexpected passes; 0 quarantined failure(s) (non-blocking)"
    summary = check["output"]["summary"]
    assert ("**Fixes 1 known failure(s) of `l4`** (2 test(s) listed as failing there now pass; the backend's "
            "descriptor should bound or remove each entry):") in summary
    assert f"- ` {MATCH} `: ` {ENTRY['reason']} ` (` {ENTRY['link']} `); 2 test(s), first " \
           "` dtensor_argminmax::test_argmax[Shard(0)-dim=-1-1d-ties] `" in summary
    (run,) = relay.store.runs(backend="l4", pr_number=81)
    assert relay.store.test_results([run.id], ["failed", "error", "xpassed"]) == []
    # The level review does not count the fixed entries against the backend: the run is a success there.
    now = dt.datetime.now(dt.timezone.utc)
    stats = week_stats("l4", relay.store.runs(backend="l4"), now - dt.timedelta(days=7), now)
    assert (stats.runs, stats.successes) == (1, 1)

    # The same fix seen on a push to upstream's main: the proposals bound the entry to torch < that build.
    main_head = "c" * 40
    push_nonce = drive.nonce("l4", drive.push(after=main_head))
    assert drive.start("l4", push_nonce, run_id=5002).status_code == 200
    assert drive.complete("l4", push_nonce, "success", run_id=5002,
                          report_body=fixed_report(main_head, MAIN_TORCH)).status_code == 200
    relay.fake.add_file(DESCRIPTORS, "backends/l4.yaml", DESCRIPTOR)
    proposer = Proposer(relay.store, GitHubClient(relay.fake.url, token="test-token"), load_allowlist(results_backends),
                        repository=DESCRIPTORS, criteria=LEVEL_CRITERIA, dashboard_url="http://dashboard.test")
    outcomes = {(o.backend, o.kind): o for o in proposer.propose_once()}
    branch = bound_branch("l4", MATCH)
    assert (outcomes[("l4", "bound")].action, outcomes[("l4", "bound")].branch) == ("opened", branch)
    assert ("l2", "bound") not in outcomes, "a backend whose main runs fixed nothing gets no bound proposal"
    (pr,) = [p for p in relay.fake.pull_requests(DESCRIPTORS) if p["head"]["ref"] == branch]
    assert pr["title"] == f"l4: known failure {MATCH} is fixed in torch 2.16.0a0"
    assert "to torch before ` 2.16.0a0 `: on pushes to upstream's main branch, on that torch, tests it covers pass" \
        in pr["body"]
    bounded = relay.fake.file(DESCRIPTORS, "backends/l4.yaml", branch).decode()
    assert bounded == DESCRIPTOR.replace(f"    link: {ENTRY['link']}\n",
                                         f"    link: {ENTRY['link']}\n    torch: \"<2.16.0a0\"\n")

    # Once merged, there is nothing left to propose: the bound already leaves that torch out.
    relay.fake.merge_pull_request(DESCRIPTORS, pr["number"])
    again = {(o.backend, o.kind): o.action for o in proposer.propose_once()}
    assert again[("l4", "bound")] == "applied"
    assert relay.fake.openapi is not None, "the fake GitHub checked no request against GitHub's REST description"
    assert relay.fake.schema_violations == [] and relay.fake.answer_violations == []
