"""``conformance callback`` (conformance/callback.py) against a served relay over real HTTP: OIDC from the
fake issuer's token service and static tokens, the token masked, retries on 503/429/dropped
connections through a proxy, the bound on Retry-After, the relay's 4xx shown, a missing
``in_progress`` sent first, a truncated report turned into completed/failure with its message, and
no torch imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.callback import ALLOW_HTTP_LOOPBACK, build_parser, completed_body, conclusion_for, run_callback
from relay.testing.flaky_proxy import DROP, FlakyProxy
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import AUDIENCE, REPOS, TOKENS, report

ROOT = Path(__file__).resolve().parents[3]


def job_env(relay_url: str, nonce: str, backend: str = "l4", run_id: int = 7001, **extra) -> dict[str, str]:
    env = {"RELAY_CALLBACK_URL": f"{relay_url}/github/callback", "RELAY_AUDIENCE": AUDIENCE, "NONCE": nonce,
           "RUN_ID": str(run_id), "RUN_ATTEMPT": "1", "RUN_URL": f"https://github.com/{REPOS[backend]}/actions/runs/{run_id}",
           "GITHUB_ACTIONS": "true", ALLOW_HTTP_LOOPBACK: "1"}
    if "ACTIONS_ID_TOKEN_REQUEST_URL" not in extra:
        env["RELAY_CALLBACK_TOKEN"] = TOKENS[backend]
    return {**env, **extra}


def call(env: dict[str, str], *argv: str) -> int:
    return run_callback(build_parser().parse_args(["--backoff-seconds", "0.05", *argv]), env)


def completed(tmp_path: Path, outcome: str = "success", job: str = "success", content: str | None = None) -> list[str]:
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    return ["completed", "--suite-outcome", outcome, "--job-status", job, "--report", str(path)]


def test_oidc_run_in_progress_then_completed_and_the_token_is_masked(sqlite_url, results_relay, oidc_issuer,  # noqa: F811
                                                                     tmp_path, capsys):
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l2", drive.open_pr(7))
    env = job_env(relay.url, nonce, "l2", 9001, **oidc_issuer.actions_token_env(REPOS["l2"], run_id=9001))
    assert call(env, "in-progress") == 0
    assert call(env, *completed(tmp_path, content=json.dumps(report("l2")))) == 0
    out = capsys.readouterr().out
    (run,) = relay.store.runs(backend="l2", pr_number=7)
    assert (run.state, run.conclusion, run.run_id) == ("completed", "success", 9001)
    assert len(relay.store.test_results([run.id])) == 2
    assert oidc_issuer.token_requests == [AUDIENCE, AUDIENCE]  # a fresh token per callback
    masks = [line.removeprefix("::add-mask::") for line in out.splitlines() if line.startswith("::add-mask::")]
    request_token = env["ACTIONS_ID_TOKEN_REQUEST_TOKEN"]
    assert masks[0::2] == [request_token, request_token], "the request token is masked before it is used"
    assert len(masks) == 4 and len(set(masks[1::2])) == 2, "each callback masks its own OIDC token"
    for secret in set(masks):
        assert out.count(secret) == masks.count(secret), "a secret shows only in its own mask commands"


def test_truncated_report_is_a_failure_with_the_reason(sqlite_url, results_relay, tmp_path, capsys):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(8))
    env = job_env(relay.url, nonce)
    assert call(env, "in-progress") == 0
    whole = json.dumps(report("l4"))
    assert call(env, *completed(tmp_path, content=whole[: len(whole) // 2])) == 0
    (run,) = relay.store.runs(backend="l4", pr_number=8)
    assert (run.state, run.conclusion) == ("completed", "failure")
    assert "is not valid JSON (truncated?)" in run.reason
    assert relay.store.test_results([run.id]) == []
    assert "::error::" in capsys.readouterr().out  # the suite said success: the log says why it is not


def test_off_schema_and_missing_reports_are_failures_too(sqlite_url, results_relay, tmp_path):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    bad = report("l4")
    del bad["torch"]
    for number, argv in ((9, completed(tmp_path, content=json.dumps(bad))), (10, completed(tmp_path / "none"))):
        nonce = drive.nonce("l4", drive.open_pr(number))
        env = job_env(relay.url, nonce, run_id=7000 + number)
        assert call(env, "in-progress") == 0 and call(env, *argv) == 0
        (run,) = relay.store.runs(backend="l4", pr_number=number)
        assert run.conclusion == "failure"
        assert ("does not follow the report schema" if number == 9 else "the suite wrote no report") in run.reason


def test_503_429_and_a_dropped_connection_are_retried(sqlite_url, results_relay, tmp_path):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(11))
    with FlakyProxy(relay.url) as proxy:
        env = job_env(proxy.url, nonce)
        proxy.fail(503, 503, path="/github/callback")
        assert call(env, "in-progress") == 0
        proxy.fail(429, path="/github/callback", retry_after=0.2)
        proxy.fail(DROP, path="/github/callback")
        assert call(env, *completed(tmp_path, content=json.dumps(report("l4")))) == 0
    assert [status for _, _, status in proxy.seen] == [503, 503, 200, 429, DROP, 200]
    (run,) = relay.store.runs(backend="l4", pr_number=11)
    assert (run.state, run.conclusion) == ("completed", "success")


def test_retry_after_beyond_the_bound_gives_up_with_the_reason(sqlite_url, results_relay, tmp_path, capsys):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(12))
    with FlakyProxy(relay.url) as proxy:
        proxy.fail(429, path="/github/callback", retry_after=120)
        assert call(job_env(proxy.url, nonce), "--max-seconds", "5", "in-progress") == 1
    out = capsys.readouterr().out
    assert "gave up after 1 attempts within 5 s" in out and "Retry-After 120 s is beyond the time left" in out
    assert [r.state for r in relay.store.runs(backend="l4", pr_number=12)] in ([], ["dispatched"])  # never reached


def test_a_4xx_fails_at_once_with_the_relays_error(sqlite_url, results_relay, capsys):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    drive.open_pr(13)
    with FlakyProxy(relay.url) as proxy:
        assert call(job_env(proxy.url, "n" * 32), "in-progress") == 1
    assert len(proxy.seen) == 1  # not retried
    assert "callback in_progress refused by the relay: HTTP 404 unknown_nonce: the nonce matches no dispatch" \
        in capsys.readouterr().out
    wrong_token = job_env(relay.url, drive.nonce("l4", drive.open_pr(14)), RELAY_CALLBACK_TOKEN="not-a-token")
    assert call(wrong_token, "in-progress") == 1
    assert "HTTP 401" in capsys.readouterr().out


def test_completed_without_in_progress_sends_in_progress_first(sqlite_url, results_relay, tmp_path):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(15))
    assert call(job_env(relay.url, nonce), *completed(tmp_path, "failure", "failure", json.dumps(report("l4")))) == 0
    (run,) = relay.store.runs(backend="l4", pr_number=15)
    assert (run.state, run.conclusion) == ("completed", "failure")
    assert run.started_at is not None and run.started_at <= run.finished_at


def test_no_credential_is_a_clear_error(capsys):
    env = {"RELAY_CALLBACK_URL": "http://127.0.0.1:9/github/callback", "NONCE": "n" * 32, "RUN_ID": "1",
           ALLOW_HTTP_LOOPBACK: "1"}
    assert run_callback(build_parser().parse_args(["in-progress"]), env) == 1
    assert "give the job 'permissions: id-token: write'" in capsys.readouterr().err


@pytest.mark.parametrize("outcome,job,elapsed,expected", [
    ("success", "success", 10, "success"),
    ("failure", "failure", 10, "failure"),
    ("skipped", "failure", 10, "failure"),      # torch install failed: the suite never ran
    ("cancelled", "cancelled", 10, "cancelled"),
    ("success", "cancelled", 10, "cancelled"),  # cancelled after the suite, before the callback
    ("cancelled", "cancelled", 3600, "timed_out"),  # the job used up its timeout-minutes (60)
    ("failure", "failure", 3599, "timed_out"),
])
def test_conclusion_mapping(outcome, job, elapsed, expected):
    assert conclusion_for(outcome, job, started_at=1000.0, timeout_minutes=60, now=1000.0 + elapsed) == expected


def test_callback_imports_no_torch(sqlite_url, results_relay, tmp_path):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(16))
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch must not be imported by the callback client')\n")
    env = {**os.environ, **job_env(relay.url, nonce), "PYTHONPATH": f"{blocker.parent}:{ROOT}"}
    result = subprocess.run([sys.executable, "-m", "conformance.cli", "callback", "in-progress"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert relay.store.runs(backend="l4", pr_number=16)[0].state == "in_progress"


def test_the_final_callback_runs_on_the_standard_library_alone(sqlite_url, results_relay, tmp_path):  # noqa: F811
    # The workflow's last resort when the package did not install: the callback modules from its own
    # source, on an interpreter with nothing installed (-S: no site-packages, so no pydantic or yaml).
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(17))
    bare = [sys.executable, "-S"]
    assert subprocess.run([*bare, "-c", "import pydantic"], capture_output=True, env={}).returncode != 0
    log = tmp_path / "install-conformance.log"
    log.write_text("ERROR: Could not find a version that satisfies the requirement pydantic>=2.6\n")
    env = {**job_env(relay.url, nonce), "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    argv = ["completed", "--suite-outcome", "", "--job-status", "failure", "--report", str(tmp_path / "report.json"),
            "--failed-step", "install-conformance", "--step-log", str(log)]
    result = subprocess.run([*bare, "-m", "conformance.callback", *argv], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = relay.store.runs(backend="l4", pr_number=17)
    assert (run.state, run.conclusion) == ("completed", "failure")
    assert run.reason == ("step 'install-conformance' failed before the suite ran; its last lines:\n"
                          "ERROR: Could not find a version that satisfies the requirement pydantic>=2.6")


def test_a_failed_steps_annotations_reach_the_relay_as_their_text(tmp_path):
    log = tmp_path / "check-torch.log"
    log.write_text("torch 2.13.0 built from cf30153c4c13\n"
                   "::error::conformance preflight: wrong torch: tested torch built from cf30153c4c13\n"
                   "::warning file=x.py,line=3::a warning\n")
    body = completed_body({"nonce": "n"}, "failure", None, failed_step="check-torch", step_log=log)
    assert body["message"] == ("step 'check-torch' failed before the suite ran; its last lines:\n"
                               "torch 2.13.0 built from cf30153c4c13\n"
                               "conformance preflight: wrong torch: tested torch built from cf30153c4c13\n"
                               "a warning")
