"""The fake GitHub's server: one HTTP server on 127.0.0.1, its routes table, and the checks every request
passes (credentials, scripted faults, GitHub's published request schemas) before an area answers it.

The areas (:mod:`.apps`, :mod:`.dispatches`, :mod:`.checks`, :mod:`.git_data`, :mod:`.pulls`) are mixins
of :class:`FakeGitHub`; each answers its endpoints from the state ``__init__`` makes.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote

from relay.testing.fake_github.apps import GitHubApps
from relay.testing.fake_github.checks import Checks
from relay.testing.fake_github.dispatches import Dispatches
from relay.testing.fake_github.faults import Fault, RecordedRequest
from relay.testing.fake_github.git_data import GitData
from relay.testing.fake_github.pulls import PullRequests
from relay.testing.github_openapi import GitHubOpenApi
from relay.testing.loopback import LoopbackServer

__all__ = ["FakeGitHub"]

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"/repos/{_REPO}/dispatches"), "dispatches"),
    ("GET", re.compile(rf"/repos/{_REPO}/installation"), "installation"),
    ("POST", re.compile(r"/app/installations/(?P<id>\d+)/access_tokens"), "access_tokens"),
    ("POST", re.compile(rf"/repos/{_REPO}/statuses/(?P<sha>[0-9a-fA-F]+)"), "statuses"),
    ("POST", re.compile(rf"/repos/{_REPO}/check-runs"), "check_runs"),
    ("POST", re.compile(rf"/repos/{_REPO}/check-runs/(?P<id>\d+)/rerequest"), "check_run_rerequest"),
    ("GET", re.compile(rf"/repos/{_REPO}/check-runs/(?P<id>\d+)"), "check_run"),
    ("PATCH", re.compile(rf"/repos/{_REPO}/check-runs/(?P<id>\d+)"), "check_run"),
    ("POST", re.compile(rf"/repos/{_REPO}/actions/runs/(?P<id>\d+)/rerun"), "workflow_rerun"),
    ("GET", re.compile(rf"/repos/{_REPO}/contents/(?P<path>.+)"), "contents"),
    ("PUT", re.compile(rf"/repos/{_REPO}/contents/(?P<path>.+)"), "contents"),
    ("GET", re.compile(rf"/repos/{_REPO}/git/ref/(?P<ref>.+)"), "git_ref"),
    ("PATCH", re.compile(rf"/repos/{_REPO}/git/refs/(?P<ref>.+)"), "git_ref"),
    ("POST", re.compile(rf"/repos/{_REPO}/git/refs"), "git_refs"),
    ("GET", re.compile(rf"/repos/{_REPO}/pulls"), "pulls"),
    ("POST", re.compile(rf"/repos/{_REPO}/pulls"), "pulls"),
    ("GET", re.compile(rf"/repos/{_REPO}/pulls/(?P<number>\d+)"), "pull"),
    ("PATCH", re.compile(rf"/repos/{_REPO}/pulls/(?P<number>\d+)"), "pull"),
    ("GET", re.compile(rf"/repos/{_REPO}"), "repository"),
]


class FakeGitHub(GitHubApps, Dispatches, Checks, GitData, PullRequests, LoopbackServer):
    """FakeGitHub(tokens=("test-token",), app_id=None, app_public_key_pem=None, latency=0.0).

    ``check_bodies`` (default on): when GitHub's REST description is installed
    (:mod:`relay.testing.github_openapi`), every request body is validated against its operation's
    schema; a body GitHub would refuse is answered 422 with the problems, as GitHub does, and kept in
    ``schema_violations``. The fake's own answers for files and branches are checked against GitHub's
    response schemas, and any misfit is kept in ``answer_violations``. ``openapi`` is the validator in
    use (None when the description is absent).
    """

    def __init__(
        self,
        *,
        tokens: Iterable[str] = ("test-token",),
        app_id: str | int | None = None,
        app_public_key_pem: str | bytes | None = None,
        token_lifetime_seconds: float = 3600.0,
        latency: float = 0.0,
        require_auth: bool = True,
        check_bodies: bool = True,
    ):
        self.tokens = set(tokens)
        self.app_id = None if app_id is None else str(app_id)
        self.app_public_key_pem = app_public_key_pem
        self.token_lifetime_seconds = token_lifetime_seconds
        self.latency = latency
        self.require_auth = require_auth
        self.installations: dict[str, int] = {}  # repository (lower) -> installation id
        self.issued_tokens: dict[str, tuple[int, float]] = {}  # token -> (installation, expires epoch)
        self.revoked: set[str] = set()
        self.check_runs: dict[int, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []
        # Git: blob sha -> bytes; commit sha -> {"tree": {path: blob sha}, "parents": [...], "message": str};
        # repository -> branch -> commit sha; repository -> number -> pull request.
        self.blobs: dict[str, bytes] = {}
        self.commits: dict[str, dict[str, Any]] = {}
        self.branches: dict[str, dict[str, str]] = {}
        self.pulls: dict[str, dict[int, dict[str, Any]]] = {}
        self._clock = itertools.count(1)
        self._requests: list[RecordedRequest] = []
        self._faults: list[tuple[str | None, str | None, Fault]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1000)
        self.openapi = GitHubOpenApi.installed() if check_bodies else None
        self.schema_violations: list[tuple[str, str, list[str]]] = []
        # Answers of the fake that do not fit GitHub's response schemas (relay.testing.github_openapi.RESPONSES).
        self.answer_violations: list[tuple[str, str, list[str]]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)

    def script(self, *faults: Fault, repository: str | None = None, endpoint: str | None = "dispatches") -> None:
        """Queue faults for requests to ``endpoint`` (None: any) of ``repository`` (None: any)."""
        with self._lock:
            self._faults.extend((repository.lower() if repository else None, endpoint, f) for f in faults)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def faults_left(self) -> int:
        """Scripted faults not yet taken by a request (a request takes its fault when it arrives)."""
        with self._lock:
            return len(self._faults)

    def _next_fault(self, endpoint: str | None, repository: str | None) -> Fault | None:
        with self._lock:
            for index, (repo, ep, fault) in enumerate(self._faults):
                if (repo is None or repo == repository) and (ep is None or ep == endpoint):
                    del self._faults[index]
                    return fault
        return None

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def handle(self, method: str, path: str, headers: dict[str, str], body: Any,
               query: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        for route_method, pattern, endpoint in _ROUTES:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                break
        else:
            return 404, {}, {"message": "Not Found"}
        params = {key: unquote(value) for key, value in match.groupdict().items()}
        params["query"] = query or {}
        params["method"] = method
        repo = params.get("repo", "").lower() or None
        token = self._token_of(headers)
        if endpoint in ("installation", "access_tokens"):
            ok, why = self._app_jwt_ok(token)
            if not ok:
                return 401, {}, {"message": why}
        elif self.require_auth:
            valid, installation = self._user_token_ok(token)
            if not valid:
                return 401, {}, {"message": "Bad credentials"}
            if endpoint == "check_runs" and not installation:
                return 403, {}, {"message": "You must authenticate via a GitHub App."}
        answer = getattr(self, f"_on_{endpoint}")
        if self.openapi is not None:
            problems = self.openapi.problems(method, path, body)
            if problems:
                with self._lock:
                    self.schema_violations.append((method, path, problems))
                if endpoint == "dispatches":  # side-effect free, and it answers GitHub's own limit messages
                    refused = answer(params, repo, body)
                    if refused[0] >= 400:
                        return refused
                return 422, {}, {"message": "Invalid request.\n\n" + "; ".join(problems)}
        status, extra, out = answer(params, repo, body)
        if self.openapi is not None:
            problems = self.openapi.answer_problems(method, path, status, out)
            if problems:
                with self._lock:
                    self.answer_violations.append((method, path, problems))
        return status, extra, out


def _handler_for(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every answer on loopback.
        disable_nagle_algorithm = True

        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def _serve(self, method: str) -> None:
            arrived = time.time()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            path, _, raw_query = self.path.partition("?")
            path = path.rstrip("/")
            query = {key: values[-1] for key, values in parse_qs(raw_query).items()}
            endpoint, repository = None, None
            for route_method, pattern, name in _ROUTES:
                match = pattern.fullmatch(path)
                if match and route_method == method:
                    endpoint, repository = name, (match.groupdict().get("repo") or "").lower() or None
                    break
            fault = fake._next_fault(endpoint, repository)
            delay = fake.latency + (fault.delay if fault else 0.0)
            if delay:
                time.sleep(delay)
            if fault is not None and fault.disconnect:
                fake._record(RecordedRequest(method, path, endpoint, repository, headers, body, time.time(), None, arrived))
                self.close_connection = True
                self.connection.close()
                return
            if fault is not None and fault.status is not None:
                status, extra, answer = fault.status, dict(fault.headers), fault.body
            else:
                status, extra, answer = fake.handle(method, path, headers, body, query)
                if fault is not None:
                    extra.update(dict(fault.headers))
            fake._record(RecordedRequest(method, path, endpoint, repository, headers, body, time.time(), status, arrived))
            payload = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            lowered = {k.lower() for k in extra}
            if "x-ratelimit-remaining" not in lowered:
                self.send_header("x-ratelimit-limit", "5000")
                self.send_header("x-ratelimit-remaining", "4999")
                self.send_header("x-ratelimit-reset", str(int(time.time()) + 3600))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            if payload:
                self.wfile.write(payload)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def do_PATCH(self):
            self._serve("PATCH")

        def do_PUT(self):
            self._serve("PUT")

    return Handler
