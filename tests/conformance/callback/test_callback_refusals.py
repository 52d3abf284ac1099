"""The callback client's refusals (issue 20): only https (a loopback switch for tests), never a redirect
with the credential, one-line secrets masked whole, a 413 never resent as it was, and reports shortened
to the relay's published limits with the failures first. Against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from conformance.callback import ALLOW_HTTP_LOOPBACK, RelayLimits, build_parser, fit, run_callback
from relay.testing.loopback import LoopbackServer

Answer = tuple[int, dict[str, str], bytes]


class ScriptedServer(LoopbackServer):
    """Answers every request with ``respond(method, path, headers, body)`` and records what it got."""

    def __init__(self, respond: Callable[[str, str, dict[str, str], bytes], Answer]):
        self.respond = respond
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.requests.append((self.command, self.path, headers, body))
                status, extra, content = server.respond(self.command, self.path, headers, body)
                self.send_response(status)
                for key, value in {"Content-Length": str(len(content)), **extra}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:  # quiet
                pass

        return Handler


def ok(_method, _path, _headers, _body) -> Answer:
    return 200, {"Content-Type": "application/json"}, b'{"run": 1, "backend": "npu", "state": "in_progress"}'


def job_env(url: str, **extra: str) -> dict[str, str]:
    return {"RELAY_CALLBACK_URL": f"{url}/github/callback", "NONCE": "n" * 32, "RUN_ID": "5", "RUN_ATTEMPT": "1",
            "RELAY_CALLBACK_TOKEN": "static-token-1", "GITHUB_ACTIONS": "true", ALLOW_HTTP_LOOPBACK: "1", **extra}


def call(env: dict[str, str], *argv: str) -> int:
    return run_callback(build_parser().parse_args(["--max-seconds", "2", "--backoff-seconds", "0.01", *argv]), env)


@pytest.fixture
def relay():
    with ScriptedServer(ok) as server:
        yield server


@pytest.mark.parametrize("url,shown", [
    ("http://relay.example.org", "not http://relay.example.org: the credential would travel unprotected; use the https:// address"),
    ("file:///etc", "not file://: the credential would travel unprotected; use the https:// address"),
    ("ftp://relay.example.org", "not ftp://relay.example.org"),
])
def test_only_https_relay_urls_are_accepted(url, shown, capsys):
    env = {**job_env(url), ALLOW_HTTP_LOOPBACK: "1"}
    assert call(env, "in-progress") == 1
    out = capsys.readouterr().out
    assert f"::error::RELAY_CALLBACK_URL must be an https:// URL, {shown}" in out


def test_a_file_url_is_never_read(tmp_path, capsys):
    secret_file = tmp_path / "callback"
    secret_file.write_text("ROOT-PASSWORD-LINE")
    env = job_env(f"file://{tmp_path}")
    assert call(env, "completed", "--suite-outcome", "failure", "--job-status", "failure") == 1
    captured = capsys.readouterr()
    assert "ROOT-PASSWORD-LINE" not in captured.out + captured.err
    assert "RELAY_CALLBACK_URL must be an https:// URL, not file://" in captured.out


def test_plain_http_to_loopback_needs_the_explicit_switch(relay, capsys):
    env = job_env(relay.url)
    del env[ALLOW_HTTP_LOOPBACK]
    assert call(env, "in-progress") == 1
    assert (f"RELAY_CALLBACK_URL must be an https:// URL, not http://127.0.0.1: the credential would travel "
            f"unprotected; set {ALLOW_HTTP_LOOPBACK}=1 to allow plain http to a loopback relay (tests only)") \
        in capsys.readouterr().out
    assert relay.requests == []
    assert call(job_env(relay.url), "in-progress") == 0
    assert [(m, p) for m, p, _, _ in relay.requests] == [("POST", "/github/callback")]


def test_the_oidc_token_url_must_be_https_too(capsys):
    env = job_env("https://relay.example.org", RELAY_CALLBACK_TOKEN="", RELAY_AUDIENCE="aud",
                  ACTIONS_ID_TOKEN_REQUEST_URL="http://token.example.org/id?x=1", ACTIONS_ID_TOKEN_REQUEST_TOKEN="rt")
    assert call(env, "in-progress") == 1
    assert "ACTIONS_ID_TOKEN_REQUEST_URL must be an https:// URL, not http://token.example.org" in capsys.readouterr().out


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed_with_the_credential(status, capsys):
    with ScriptedServer(ok) as elsewhere:
        target = f"{elsewhere.url}/collect"
        with ScriptedServer(lambda *_: (status, {"Location": target}, b"")) as relay:
            assert call(job_env(relay.url), "in-progress") == 1
        assert elsewhere.requests == [], "the redirect target got a request"
    out = capsys.readouterr().out
    assert (f"::error::callback in_progress refused by the relay: HTTP {status} redirect to {target}: "
            "not followed, the credential is never sent on a redirect") in out
    assert len(relay.requests) == 1  # a redirect is an answer, not a reason to retry


def test_the_oidc_token_request_follows_no_redirect_either(capsys):
    with ScriptedServer(ok) as elsewhere:
        with ScriptedServer(lambda *_: (302, {"Location": f"{elsewhere.url}/steal"}, b"")) as issuer:
            env = job_env("https://relay.example.org", RELAY_CALLBACK_TOKEN="", RELAY_AUDIENCE="aud",
                          ACTIONS_ID_TOKEN_REQUEST_URL=f"{issuer.url}/token?api-version=2.0",
                          ACTIONS_ID_TOKEN_REQUEST_TOKEN="request-token-9")
            assert call(env, "in-progress") == 1
        assert elsewhere.requests == []
    assert "OIDC token request refused: HTTP 302 redirect to" in capsys.readouterr().out


@pytest.mark.parametrize("token,what", [
    ("first-half\nSECOND-HALF", "a newline at position 10"),
    ("first-half\r", "a newline at position 10"),
    ("first\x1bSECOND-HALF", "the control character U+001B at position 5"),
    ("first\x7fSECOND-HALF", "the control character U+007F at position 5"),
    # C1 controls and Unicode line breaks: a log or a header can take them for the end of a line.
    ("first\x85SECOND-HALF", "the control character U+0085 at position 5"),
    ("first\x9bSECOND-HALF", "the control character U+009B at position 5"),
    ("first\u2028SECOND-HALF", "the non-ASCII character U+2028 at position 5"),
    ("firsté-SECOND-HALF", "the non-ASCII character U+00E9 at position 5"),
])
def test_a_token_with_a_control_character_is_refused_and_never_shown(relay, token, what, capsys):
    assert call(job_env(relay.url, RELAY_CALLBACK_TOKEN=token), "in-progress") == 1
    captured = capsys.readouterr()
    assert (f"::error::RELAY_CALLBACK_TOKEN contains {what}: a credential is one line of printable ASCII; "
            "remove the trailing newline or stray character from the secret") in captured.out
    assert "SECOND-HALF" not in captured.out + captured.err and "::add-mask::" not in captured.out
    assert relay.requests == []


def test_an_oidc_token_with_a_newline_is_refused_and_never_shown(capsys):
    def issue(_m, _p, _h, _b) -> Answer:
        return 200, {"Content-Type": "application/json"}, json.dumps({"value": "eyJhead\nPAYLOAD-REST"}).encode()

    with ScriptedServer(issue) as issuer, ScriptedServer(ok) as relay:
        env = job_env(relay.url, RELAY_CALLBACK_TOKEN="", RELAY_AUDIENCE="aud",
                      ACTIONS_ID_TOKEN_REQUEST_URL=f"{issuer.url}/token?api-version=2.0",
                      ACTIONS_ID_TOKEN_REQUEST_TOKEN="request-token-9")
        assert call(env, "in-progress") == 1
        assert relay.requests == []
    out = capsys.readouterr().out
    assert "the OIDC token contains a newline at position 7" in out and "PAYLOAD-REST" not in out


def test_the_whole_static_token_is_masked_before_it_is_used(relay, capsys):
    assert call(job_env(relay.url, RELAY_CALLBACK_TOKEN="tok-3f9a-whole"), "in-progress") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "::add-mask::tok-3f9a-whole"
    assert relay.requests[0][2]["authorization"] == "Token tok-3f9a-whole"


def test_the_whole_oidc_token_is_masked_before_it_is_used(capsys):
    token = "eyJhbGciOiJSUzI1NiJ9.eyJyZXBvc2l0b3J5Ijoib3JnL25wdS1jaSJ9.c2lnbmF0dXJl-part_2"

    def issue(_m, _p, _h, _b) -> Answer:
        return 200, {"Content-Type": "application/json"}, json.dumps({"value": token}).encode()

    with ScriptedServer(issue) as issuer, ScriptedServer(ok) as relay:
        env = job_env(relay.url, RELAY_CALLBACK_TOKEN="", RELAY_AUDIENCE="aud",
                      ACTIONS_ID_TOKEN_REQUEST_URL=f"{issuer.url}/token?api-version=2.0",
                      ACTIONS_ID_TOKEN_REQUEST_TOKEN="request-token-9")
        assert call(env, "in-progress") == 0
        assert relay.requests[0][2]["authorization"] == f"Bearer {token}"
    lines = capsys.readouterr().out.splitlines()
    # Both secrets masked whole, each on its line, before anything else is printed.
    assert lines[:2] == ["::add-mask::request-token-9", f"::add-mask::{token}"], lines


def report(tests: list[dict]) -> dict:
    outcomes = [t["outcome"] for t in tests]
    return {"schema_version": "1.0",
            "backend": {"name": "npu", "device_type": "cpu", "distributed_backend": "gloo", "world_size": 2,
                        "capabilities": {}},
            "torch": {"version": "2.13.0", "git_version": "a" * 40},
            "host": {"python": "3.11", "platform": "linux", "cpu": "x86_64"},
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:10:00Z",
            "summary": {"passed": outcomes.count("passed"), "failed": outcomes.count("failed"), "total": len(tests)},
            "tests": tests}


def many_tests(failed: int, passed: int, message_chars: int) -> list[dict]:
    tests = [{"nodeid": f"conformance/suites/test_x.py::test_ok[{i}]", "suite": "x", "outcome": "passed",
              "duration": 0.01} for i in range(passed)]
    tests += [{"nodeid": f"conformance/suites/test_x.py::test_bad[{i}]", "suite": "x", "outcome": "failed",
               "duration": 0.01, "message": f"failure {i}: " + "x" * message_chars} for i in range(failed)]
    return tests


def test_a_body_that_fits_is_sent_unchanged():
    body = {"state": "completed", "conclusion": "failure", "report": report(many_tests(3, 3, 100))}
    assert fit(body, RelayLimits()) == (body, None)


def test_ten_thousand_failures_with_long_messages_are_shortened_failures_first():
    tests = many_tests(10_000, 500, 3_000)
    body = {"nonce": "n" * 32, "state": "completed", "conclusion": "failure", "report": report(tests)}
    limits = RelayLimits(max_bytes=6 * 1024 * 1024, max_tests=20_000, max_message_chars=16_384)
    assert len(json.dumps(body)) > limits.max_bytes
    fitted, note = fit(body, limits)
    sent = fitted["report"]["tests"]
    assert len(json.dumps(fitted).encode()) <= limits.max_bytes
    assert [t["outcome"] for t in sent[:10_000]] == ["failed"] * 10_000, "every failure is kept, first"
    assert sent[0]["nodeid"].endswith("test_bad[0]") and sent[0]["message"].startswith("failure 0: ")
    assert max(len(t.get("message", "")) for t in sent) == 300
    assert fitted["report"]["summary"] == body["report"]["summary"], "the summary still counts every test"
    assert note.startswith("the report was shortened to fit the relay's limits (6291456 bytes, 20000 tests, "
                           "16384 characters a message): ")
    assert "10000 messages cut to 300 characters" in note
    assert fitted["report"]["events"][-1] == note
    assert body["report"]["tests"] is tests and len(tests) == 10_500, "the caller's report is left as it was"


def test_tests_beyond_the_count_limit_are_left_out_passed_ones_first():
    body = {"state": "completed", "report": report(many_tests(30, 100, 10))}
    fitted, note = fit(body, RelayLimits(max_tests=50))
    sent = fitted["report"]["tests"]
    assert len(sent) == 50 and [t["outcome"] for t in sent[:30]] == ["failed"] * 30
    assert "80 of 130 tests left out (80 passed)" in note


def test_a_413_is_never_resent_as_it_was(tmp_path, capsys):
    posts: list[int] = []

    def too_large(method, _path, _headers, body) -> Answer:
        if method == "GET":
            limits = {"max_bytes": 400_000, "max_tests": 20_000, "max_message_chars": 16_384}
            return 200, {"Content-Type": "application/json"}, json.dumps(limits).encode()
        posts.append(len(body))
        return 413, {"Content-Type": "application/json"}, b'{"error": "payload_too_large", "detail": "over"}'

    path = tmp_path / "report.json"
    path.write_text(json.dumps(report(many_tests(300, 300, 2_000))))
    with ScriptedServer(too_large) as relay:
        assert call(job_env(relay.url), "completed", "--suite-outcome", "failure", "--job-status", "failure",
                    "--report", str(path)) == 1
        assert call(job_env(relay.url), "in-progress") == 1
    assert len(posts) == 3, "completed: the fitted body, then once at half the bytes; in-progress: once"
    assert posts[0] <= 400_000 and posts[1] <= 200_000
    out = capsys.readouterr().out
    assert "::error::callback completed refused by the relay: HTTP 413 payload_too_large: over" in out
    assert "shortening the report further" in out


def test_the_limits_fall_back_to_the_relay_defaults_which_match_its_settings(relay):
    from relay.settings import Settings

    fields = Settings.model_fields
    assert RelayLimits() == RelayLimits(fields["callback_max_bytes"].default, fields["callback_max_tests"].default,
                                        fields["callback_max_message_chars"].default)
