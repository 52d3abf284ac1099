"""End to end, for real: a signed real webhook -> the relay -> the dispatch the fake GitHub records ->
act runs that exact event through the example caller and the reusable workflow of this checkout ->
a real ``conformance run`` of a quick subset on CPU with the installed torch -> ``conformance
callback`` (OIDC from the fake issuer) -> the relay -> a status (token mode) or a check run (App mode)
on the fake GitHub -> the dashboard's PR and run pages.

Cases: a pass (the webhook's head is the installed torch's git_version) with the relay answering 503
to the first callbacks, a real failing test (a descriptor without one of its known failures), a
cancellation (act interrupted while the job runs), and a provenance mismatch (the job stops before the
suite, and the PR's check says which torch it found).
Each act run takes about 20 s (a fresh virtual environment, the package built from this checkout,
two ranks over gloo); the relay and its fakes are shared by the token-mode cases.
"""

from __future__ import annotations


import pytest

from bench.e2e_loop import BACKEND, PREMUL, Loop, torch_git_version, without_known_failure
from relay.testing import loopback_client
from tests.workflows.act_support import ACT_MARKS, real_pr_webhook, upstream_repository

pytestmark = ACT_MARKS

SUM = "collectives::test_all_reduce[SUM-float32]"


@pytest.fixture(scope="module")
def torch_commit() -> str:
    return torch_git_version()


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    upstream = upstream_repository()
    loop = Loop(tmp_path_factory.mktemp("e2e"), upstream=upstream)
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def _every_call_to_github_fits_its_description(loop):
    yield
    assert loop.fake.schema_violations == []


def statuses(loop: Loop, sha: str) -> list[dict]:
    return [s for s in loop.fake.statuses if s["context"] == f"crcr/{BACKEND}" and s["sha"] == sha]


def wait_final_status(loop: Loop, sha: str, timeout: float = 30) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [s for s in statuses(loop, sha) if s["state"] != "pending"]
        if done:
            return done[-1]
        time.sleep(0.05)
    raise AssertionError(f"no final status on {sha}: {statuses(loop, sha)}")


def test_pass_with_the_relay_briefly_answering_503(loop, torch_commit):
    delivery = loop.webhook("pull_request", real_pr_webhook(101, torch_commit))
    dispatch = loop.dispatch_of(delivery)
    assert dispatch["client_payload"]["head"]["sha"] == torch_commit
    loop.proxy.fail(503, 503, path="/github/callback")
    act = loop.act(dispatch, name="pass")
    assert act.returncode == 0, act.log[-4000:]
    callbacks = [status for method, path, status in loop.proxy.seen  # the callbacks, not the GET of the limits
                 if method == "POST" and path == "/github/callback"]
    assert callbacks[:3] == [503, 503, 200] and callbacks.count(200) == 2, callbacks  # retried, then both sent

    run = loop.wait_run(101, lambda r: r["state"] == "completed", "completed")
    assert (run["outcome"], run["provenance"], run["torch_git_version"]) == ("success", "matched", torch_commit)
    assert (run["passed"], run["total"]) == (1, 2)  # SUM passed, PREMUL_SUM a known failure (xfailed)
    final = wait_final_status(loop, torch_commit)
    assert final["state"] == "success" and final["target_url"] == f"http://dashboard.e2e/runs/{run['run']}"
    assert [s["state"] for s in statuses(loop, torch_commit)][0] == "pending"
    page = loopback_client().get(f"{loop.relay.url}/runs/{run['run']}").text
    assert "collectives" in page and "the tested torch is the dispatched commit" in page
    assert f"/runs/{run['run']}" in loopback_client().get(f"{loop.relay.url}/prs/101").text
    tests = loopback_client().get(f"{loop.relay.url}/api/tests/{SUM}").json()
    assert any(h["run"] == run["run"] and h["outcome"] == "passed" for h in tests["history"]), tests


def test_a_real_failing_test_fails_upstream(loop, torch_commit):
    delivery = loop.webhook("pull_request", real_pr_webhook(102, torch_commit))
    descriptors = without_known_failure(loop.work / "strict-descriptors", "collectives::test_*[PREMUL_SUM-*]")
    act = loop.act(loop.dispatch_of(delivery), name="failing", env={"CONFORMANCE_BACKENDS_DIR": str(descriptors)})
    assert act.returncode != 0  # the suite step failed, and so the job
    run = loop.wait_run(102, lambda r: r["state"] == "completed", "completed")
    assert run["outcome"] == "failure"
    pr = loop.run(102)
    failing = {f["test_id"]: f["message"] for f in pr["failing"]}
    assert PREMUL in failing and "PREMUL_SUM" in failing[PREMUL], failing
    final = wait_final_status(loop, torch_commit)
    assert final["state"] == "failure" and PREMUL in final["description"]
    assert PREMUL in loopback_client().get(f"{loop.relay.url}/prs/102").text


def test_cancelled_while_the_suite_runs_reaches_the_relay(loop, torch_commit):
    sha = torch_commit  # the job checks its torch before the suite: it must be the dispatched commit's
    delivery = loop.webhook("pull_request", real_pr_webhook(103, sha))

    def suite_running(log: str) -> bool:
        return "Run Main Run the conformance suite" in log

    act = loop.act(loop.dispatch_of(delivery), name="cancel", interrupt_when=suite_running)
    assert act.returncode != 0, act.log[-4000:]  # the suite step was cut short
    run = loop.wait_run(103, lambda r: r["state"] not in ("dispatched", "in_progress"), "the end of the run")
    assert run["state"] == "cancelled", act.log[-4000:]
    assert "relay: run" in act.log and "is cancelled (cancelled)" in act.log  # the final callback, after the interrupt
    assert "the tested torch" not in loopback_client().get(f"{loop.relay.url}/runs/{run['run']}").text  # no report, no provenance


def test_provenance_mismatch_is_never_a_pass(tmp_path, torch_commit):
    upstream = upstream_repository()
    loop = Loop(tmp_path, upstream=upstream, app_mode=True)
    try:
        other = "0123456789abcdef" * 2 + "01234567"
        assert other != torch_commit
        delivery = loop.webhook("pull_request", real_pr_webhook(104, other))
        act = loop.act(loop.dispatch_of(delivery), name="mismatch")
        # The job checks the torch before the suite (issue 20): no device time is spent on the wrong build.
        assert act.returncode != 0, act.log[-4000:]
        assert "Run Main Run the conformance suite" not in act.log
        run = loop.wait_run(104, lambda r: r["state"] == "completed", "completed")
        assert run["outcome"] == "failure"
        assert run["provenance"] is None  # no report: the relay's own check has nothing to read
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            checks = [c for c in loop.fake.check_runs.values() if c["name"] == f"crcr/{BACKEND}" and c["status"] == "completed"]
            if checks:
                break
            time.sleep(0.05)
        (check,) = checks
        assert (check["head_sha"], check["conclusion"]) == (other, "failure")
        assert f"tested torch built from {torch_commit[:12]}, expected {other[:12]}" in check["output"]["summary"]
        assert "wrong torch" in loopback_client().get(f"{loop.relay.url}/runs/{run['run']}").text
        assert loop.fake.schema_violations == []
    finally:
        loop.close()
