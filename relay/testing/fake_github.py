"""A fake GitHub API server on 127.0.0.1, for the relay's tests and for backend owners' own tests.

Started by a test (``with FakeGitHub() as gh: ...``); real HTTP, so github3.py and the relay talk to it
exactly as to api.github.com (point ``RELAY_GITHUB_API_URL`` at ``gh.url``). It records every request
(``gh.requests``) and implements what the relay uses:

    POST  /repos/{o}/{r}/dispatches                   204; 422 beyond GitHub's event_type/client_payload limits
    GET   /repos/{o}/{r}                              repository, with absolute URLs pointing here
    GET   /repos/{o}/{r}/installation                 the GitHub App installation (app JWT)
    POST  /app/installations/{id}/access_tokens       installation token (app JWT), 201
    POST  /repos/{o}/{r}/statuses/{sha}               commit status, 201 (state and 140-char description checked)
    POST  /repos/{o}/{r}/check-runs                   check run (installation token only), 201
    GET|PATCH /repos/{o}/{r}/check-runs/{id}          read / update a check run
    POST  /repos/{o}/{r}/check-runs/{id}/rerequest    re-run a check run, 201
    POST  /repos/{o}/{r}/actions/runs/{id}/rerun      re-run a workflow run, 201
    GET|PUT /repos/{o}/{r}/contents/{path}            a file at ?ref= (base64) / commit a file on a branch
    GET   /repos/{o}/{r}/git/ref/heads/{branch}       a branch's commit
    POST  /repos/{o}/{r}/git/refs                     create a branch, 201 (422 if it exists)
    PATCH /repos/{o}/{r}/git/refs/heads/{branch}      move a branch (fast-forward unless force)
    GET|POST /repos/{o}/{r}/pulls                     list (state, head, base, sort, direction, per_page) / open
    GET|PATCH /repos/{o}/{r}/pulls/{number}           read / update (title, body, state)

Repositories hold files in branches of commits (``add_file``, ``file``); pull requests can be merged or
closed by a person (``merge_pull_request``, ``close_pull_request``). Blob shas are git's, so a test can
compare them with ``git hash-object``.

Request bodies are checked against GitHub's published REST description when it is installed
(``relay.testing.github_openapi``): a body GitHub would refuse gets GitHub's 422.

Scripting: ``gh.script(Fault.server_error(), Fault.rate_limited(retry_after=1), repository="o/r")``
queues faults; each matching request consumes the next one. ``gh.latency`` adds a delay to every call.
Faults: slow, server_error (5xx), rate_limited (429 + retry-after), secondary_limit (403),
primary_exhausted (403, x-ratelimit-remaining 0), unprocessable (422), not_found (404),
bad_credentials (401), disconnect (connection closed without an answer).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote

from relay.testing.github_openapi import GitHubOpenApi
from relay.testing.loopback import LoopbackServer

__all__ = ["Fault", "FakeGitHub", "RecordedRequest"]

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


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scripted answer: a delay, and optionally a status, headers and body instead of the normal answer."""

    status: int | None = None
    delay: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    disconnect: bool = False

    @classmethod
    def slow(cls, seconds: float) -> "Fault":
        return cls(delay=seconds)

    @classmethod
    def server_error(cls, status: int = 502) -> "Fault":
        return cls(status=status, body={"message": "Server Error"})

    @classmethod
    def rate_limited(cls, retry_after: float = 1) -> "Fault":
        return cls(status=429, headers=(("Retry-After", f"{retry_after:g}"),), body={"message": "Too many requests"})

    @classmethod
    def secondary_limit(cls, retry_after: float | None = None) -> "Fault":
        headers = () if retry_after is None else (("Retry-After", f"{retry_after:g}"),)
        return cls(status=403, headers=headers, body={
            "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
        })

    @classmethod
    def primary_exhausted(cls, reset_in: float = 1) -> "Fault":
        reset = int(time.time() + reset_in + 0.999)
        return cls(status=403, headers=(("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", str(reset))),
                   body={"message": "API rate limit exceeded"})

    @classmethod
    def unprocessable(cls, message: str = "Validation Failed") -> "Fault":
        return cls(status=422, body={"message": message})

    @classmethod
    def not_found(cls) -> "Fault":
        return cls(status=404, body={"message": "Not Found"})

    @classmethod
    def bad_credentials(cls) -> "Fault":
        return cls(status=401, body={"message": "Bad credentials"})

    @classmethod
    def dropped(cls) -> "Fault":
        return cls(disconnect=True)


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    endpoint: str | None
    repository: str | None
    headers: dict[str, str]
    json: Any
    received_at: float  # when the answer was ready (after any scripted delay)
    answered: int | None  # status sent back (None: connection dropped)
    arrived_at: float = 0.0  # when the request came in


class FakeGitHub(LoopbackServer):
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

    # --- lifecycle ------------------------------------------------------------------------------
    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)

    # --- scripting ------------------------------------------------------------------------------
    def script(self, *faults: Fault, repository: str | None = None, endpoint: str | None = "dispatches") -> None:
        """Queue faults for requests to ``endpoint`` (None: any) of ``repository`` (None: any)."""
        with self._lock:
            self._faults.extend((repository.lower() if repository else None, endpoint, f) for f in faults)

    def install_app(self, repository: str, installation_id: int | None = None) -> int:
        installation_id = installation_id or next(self._ids)
        self.installations[repository.lower()] = installation_id
        return installation_id

    def revoke(self, token: str) -> None:
        self.revoked.add(token)

    def add_file(self, repository: str, path: str, content: bytes | str, *, branch: str = "main",
                 message: str = "add a file") -> str:
        """Commit ``content`` at ``path`` on ``branch`` (created if missing); returns the commit sha."""
        data = content.encode() if isinstance(content, str) else content
        repo = repository.lower()
        with self._lock:
            head = self.branches.setdefault(repo, {}).get(branch)
            tree = dict(self.commits[head]["tree"]) if head else {}
            tree[path] = self._store_blob(data)
            self.branches[repo][branch] = self._commit(tree, [head] if head else [], message)
            return self.branches[repo][branch]

    def file(self, repository: str, path: str, ref: str = "main") -> bytes | None:
        """The bytes of ``path`` at branch or commit ``ref`` (None: no such file)."""
        with self._lock:
            commit = self._resolve(repository.lower(), ref)
            blob = None if commit is None else self.commits[commit]["tree"].get(path)
            return None if blob is None else self.blobs[blob]

    def pull_requests(self, repository: str) -> list[dict[str, Any]]:
        """Every pull request of ``repository``, oldest first, as the API shows them."""
        repo = repository.lower()
        with self._lock:
            return [self._pull_json(repo, pr) for _, pr in sorted(self.pulls.get(repo, {}).items())]

    def merge_pull_request(self, repository: str, number: int) -> None:
        """A person merges it (a three-way merge of files); ValueError on a conflict. The pull request closes."""
        repo = repository.lower()
        with self._lock:
            pr = self.pulls[repo][number]
            head = self.branches[repo][pr["head_ref"]]
            base = self.branches[repo][pr["base_ref"]]
            ancestors = self._ancestors(base)
            order, todo = [], [head]  # nearest common ancestor: the first of head's history that base has too
            while todo:
                current = todo.pop(0)
                order.append(current)
                todo.extend(self.commits[current]["parents"])
            common = self.commits[next(c for c in order if c in ancestors)]["tree"]
            ours, theirs = self.commits[base]["tree"], self.commits[head]["tree"]
            merged = {}
            for path in set(ours) | set(theirs) | set(common):
                was, mine, incoming = common.get(path), ours.get(path), theirs.get(path)
                chosen = mine if incoming == was else incoming if mine == was else mine if mine == incoming else False
                if chosen is False:
                    raise ValueError(f"merge conflict in {path}")
                if chosen is not None:
                    merged[path] = chosen
            self.branches[repo][pr["base_ref"]] = self._commit(merged, [base, head], f"Merge pull request #{number}")
            pr.update(state="closed", merged=True, updated=next(self._clock))

    def close_pull_request(self, repository: str, number: int) -> None:
        """A person closes it without merging."""
        with self._lock:
            self.pulls[repository.lower()][number].update(state="closed", updated=next(self._clock))

    # --- records --------------------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def dispatches(self, repository: str | None = None, *, accepted_only: bool = True) -> list[dict[str, Any]]:
        """Bodies of repository_dispatch calls (those answered 204 unless ``accepted_only=False``)."""
        return [
            r.json for r in self.requests
            if r.endpoint == "dispatches" and (repository is None or r.repository == repository.lower())
            and (r.answered == 204 or not accepted_only)
        ]

    @property
    def faults_left(self) -> int:
        """Scripted faults not yet taken by a request (a request takes its fault when it arrives)."""
        with self._lock:
            return len(self._faults)

    # --- internals ------------------------------------------------------------------------------
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

    def _token_of(self, headers: dict[str, str]) -> str | None:
        value = headers.get("authorization", "")
        for prefix in ("token ", "bearer "):
            if value.lower().startswith(prefix):
                return value[len(prefix):].strip()
        return None

    def _app_jwt_ok(self, token: str | None) -> tuple[bool, str]:
        if self.app_id is None:
            return False, "this fake has no GitHub App (pass app_id=)"
        if token is None:
            return False, "A JSON web token could not be decoded"
        if self.app_public_key_pem is None:
            return True, ""
        import jwt

        try:
            claims = jwt.decode(token, self.app_public_key_pem, algorithms=["RS256"])
        except jwt.PyJWTError as exc:
            return False, f"A JSON web token could not be decoded ({exc})"
        if str(claims.get("iss")) != self.app_id:
            return False, "Integration not found"
        return True, ""

    def _user_token_ok(self, token: str | None) -> tuple[bool, bool]:
        """(valid, is_installation_token)."""
        if token is None or token in self.revoked:
            return False, False
        if token in self.tokens:
            return True, False
        issued = self.issued_tokens.get(token)
        if issued is not None and issued[1] > time.time():
            return True, True
        return False, False

    def _repo_json(self, repo: str) -> dict[str, Any]:
        owner, name = repo.split("/", 1)
        return {
            "id": abs(hash(repo)) % 10**8, "name": name, "full_name": repo, "owner": {"login": owner, "id": 1},
            "url": f"{self.url}/repos/{repo}", "html_url": f"{self.url}/{repo}", "private": False,
            "default_branch": "main",
        }

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

    def _on_dispatches(self, params, repo, body):
        if not isinstance(body, dict):
            return 400, {}, {"message": "Problems parsing JSON"}
        event_type = body.get("event_type")
        if not isinstance(event_type, str) or not 1 <= len(event_type) <= 100:
            return 422, {}, {"message": "Invalid request.\n\nevent_type must be 1 to 100 characters"}
        payload = body.get("client_payload", {})
        if not isinstance(payload, dict):
            return 422, {}, {"message": "Invalid request.\n\nclient_payload is not an object"}
        if len(payload) > 10:
            return 422, {}, {"message": "Invalid request.\n\nNo more than 10 properties are allowed; "
                                        f"{len(payload)} were supplied."}
        if len(json.dumps(payload).encode()) >= 64 * 1024:
            return 422, {}, {"message": "client_payload is too large"}
        return 204, {}, None

    def _on_repository(self, params, repo, body):
        return 200, {}, self._repo_json(repo)

    def _on_installation(self, params, repo, body):
        installation_id = self.installations.get(repo)
        if installation_id is None:
            return 404, {}, {"message": "Not Found"}
        return 200, {}, {
            "id": installation_id, "app_id": int(self.app_id), "account": {"login": repo.split("/")[0]},
            "access_tokens_url": f"{self.url}/app/installations/{installation_id}/access_tokens",
            "repository_selection": "selected", "target_type": "Organization", "permissions": {},
            "events": [], "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
            "single_file_name": None, "target_id": 1, "html_url": f"{self.url}/installations/{installation_id}",
            "repositories_url": f"{self.url}/installation/repositories",
        }

    def _on_access_tokens(self, params, repo, body):
        installation_id = int(params["id"])
        if installation_id not in self.installations.values():
            return 404, {}, {"message": "Not Found"}
        token = f"ghs_{secrets.token_hex(18)}"
        expires = time.time() + self.token_lifetime_seconds
        with self._lock:
            self.issued_tokens[token] = (installation_id, expires)
        expires_at = dt.datetime.fromtimestamp(expires, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 201, {}, {"token": token, "expires_at": expires_at, "permissions": {}, "repository_selection": "selected"}

    def _on_statuses(self, params, repo, body):
        state = (body or {}).get("state")
        if state not in ("pending", "success", "error", "failure"):
            return 422, {}, {"message": "Validation Failed", "errors": [{"field": "state", "code": "invalid"}]}
        if len((body or {}).get("description") or "") > 140:
            return 422, {}, {"message": "Validation Failed", "errors": [{"field": "description", "code": "custom",
                                                                           "message": "description is too long (maximum is 140 characters)"}]}
        status_id = next(self._ids)
        status = {"id": status_id, "url": f"{self.url}/repos/{repo}/statuses/{params['sha']}", "sha": params["sha"],
                  "context": body.get("context", "default"), "state": state, "description": body.get("description"),
                  "target_url": body.get("target_url"), "created_at": "2024-01-01T00:00:00Z"}
        with self._lock:
            self.statuses.append({"repository": repo, **status})
        return 201, {}, status

    def _on_check_runs(self, params, repo, body):
        body = body or {}
        if not body.get("name") or not body.get("head_sha"):
            return 422, {}, {"message": "Invalid request.\n\n\"name\", \"head_sha\" wasn't supplied."}
        output = body.get("output") or {}
        if len(output.get("summary") or "") > 65535 or len(output.get("text") or "") > 65535:
            return 422, {}, {"message": "Invalid request.\n\nOnly 65535 characters are allowed"}
        run_id = next(self._ids)
        run = {
            "id": run_id, "name": body["name"], "head_sha": body["head_sha"], "status": body.get("status", "queued"),
            "conclusion": body.get("conclusion"), "external_id": body.get("external_id"),
            "details_url": body.get("details_url"), "output": output,
            "url": f"{self.url}/repos/{repo}/check-runs/{run_id}", "html_url": f"{self.url}/{repo}/runs/{run_id}",
            "repository": repo,
        }
        with self._lock:
            self.check_runs[run_id] = run
        return 201, {}, run

    def _on_check_run(self, params, repo, body):
        run = self.check_runs.get(int(params["id"]))
        if run is None or run["repository"] != repo:
            return 404, {}, {"message": "Not Found"}
        if body is not None:  # PATCH
            with self._lock:
                run.update({k: v for k, v in body.items() if k != "id"})
        return 200, {}, run

    def _on_check_run_rerequest(self, params, repo, body):
        if int(params["id"]) not in self.check_runs:
            return 404, {}, {"message": "Not Found"}
        return 201, {}, {}

    def _on_workflow_rerun(self, params, repo, body):
        return 201, {}, {}

    # --- git: blobs, commits, branches, files ---------------------------------------------------
    def _store_blob(self, data: bytes) -> str:
        sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
        self.blobs[sha] = data
        return sha

    def _commit(self, tree: dict[str, str], parents: list[str], message: str) -> str:
        sha = hashlib.sha1(json.dumps([sorted(tree.items()), parents, message, next(self._ids)]).encode()).hexdigest()
        self.commits[sha] = {"tree": tree, "parents": parents, "message": message}
        return sha

    def _resolve(self, repo: str, ref: str) -> str | None:
        ref = ref.removeprefix("refs/").removeprefix("heads/")
        found = self.branches.get(repo, {}).get(ref)
        if found is None and ref in self.commits:
            return ref
        return found

    def _ancestors(self, sha: str) -> set[str]:
        seen, todo = set(), [sha]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.commits[current]["parents"])
        return seen

    def _ref_json(self, repo: str, branch: str, sha: str) -> dict[str, Any]:
        return {"ref": f"refs/heads/{branch}", "node_id": f"REF_{branch}", "url": f"{self.url}/repos/{repo}/git/refs/heads/{branch}",
                "object": {"type": "commit", "sha": sha, "url": f"{self.url}/repos/{repo}/git/commits/{sha}"}}

    def _file_json(self, repo: str, path: str, blob: str, ref: str, *, with_content: bool = True) -> dict[str, Any]:
        url = f"{self.url}/repos/{repo}/contents/{path}?ref={ref}"
        git_url = f"{self.url}/repos/{repo}/git/blobs/{blob}"
        html_url = f"{self.url}/{repo}/blob/{ref}/{path}"
        out = {"type": "file", "size": len(self.blobs[blob]), "name": path.rsplit("/", 1)[-1], "path": path,
               "sha": blob, "url": url, "git_url": git_url, "html_url": html_url,
               "download_url": f"{self.url}/raw/{repo}/{ref}/{path}",
               "_links": {"self": url, "git": git_url, "html": html_url}}
        if with_content:
            encoded = base64.b64encode(self.blobs[blob]).decode()
            # GitHub breaks the base64 into lines of 60 characters.
            out.update(encoding="base64", content="".join(encoded[i:i + 60] + "\n" for i in range(0, len(encoded), 60)))
        return out

    def _on_contents(self, params, repo, body):
        path = params["path"]
        with self._lock:
            if params["method"] == "GET":
                ref = params["query"].get("ref") or "main"
                commit = self._resolve(repo, ref)
                blob = None if commit is None else self.commits[commit]["tree"].get(path)
                if blob is None:
                    return 404, {}, {"message": "Not Found"}
                return 200, {}, self._file_json(repo, path, blob, ref)
            body = body if isinstance(body, dict) else {}
            branch = body.get("branch") or "main"
            head = self.branches.get(repo, {}).get(branch)
            if head is None:
                return 404, {}, {"message": f"Branch {branch} not found"}
            current = self.commits[head]["tree"].get(path)
            if current is not None and "sha" not in body:
                return 422, {}, {"message": "Invalid request.\n\n\"sha\" wasn't supplied."}
            if current is not None and body["sha"] != current:
                return 409, {}, {"message": f"{path} does not match {body['sha']}"}
            try:
                data = base64.b64decode(body.get("content", ""), validate=True)
            except binascii.Error:
                return 422, {}, {"message": "content is not valid Base64"}
            tree = dict(self.commits[head]["tree"])
            tree[path] = self._store_blob(data)
            commit = self._commit(tree, [head], body.get("message", ""))
            self.branches[repo][branch] = commit
            return (201 if current is None else 200), {}, {
                "content": self._file_json(repo, path, tree[path], branch, with_content=False),
                "commit": {"sha": commit, "url": f"{self.url}/repos/{repo}/git/commits/{commit}",
                           "html_url": f"{self.url}/{repo}/commit/{commit}", "message": body.get("message", ""),
                           "parents": [{"sha": head, "url": f"{self.url}/repos/{repo}/git/commits/{head}"}]},
            }

    def _on_git_ref(self, params, repo, body):
        ref = params["ref"]
        if not ref.startswith("heads/"):
            return 404, {}, {"message": "Not Found"}
        branch = ref.removeprefix("heads/")
        with self._lock:
            current = self.branches.get(repo, {}).get(branch)
            if params["method"] == "GET":
                if current is None:
                    return 404, {}, {"message": "Not Found"}
                return 200, {}, self._ref_json(repo, branch, current)
            if current is None:
                return 422, {}, {"message": "Reference does not exist"}
            sha = (body or {}).get("sha")
            if sha not in self.commits:
                return 422, {}, {"message": "Object does not exist"}
            if not (body or {}).get("force") and current not in self._ancestors(sha):
                return 422, {}, {"message": "Update is not a fast forward"}
            self.branches[repo][branch] = sha
            return 200, {}, self._ref_json(repo, branch, sha)

    def _on_git_refs(self, params, repo, body):
        ref, sha = (body or {}).get("ref", ""), (body or {}).get("sha")
        if not ref.startswith("refs/heads/") or ref.count("/") < 2:
            return 422, {}, {"message": "Reference name must start with 'refs/' and have at least two slashes."}
        branch = ref.removeprefix("refs/heads/")
        with self._lock:
            if sha not in self.commits:
                return 422, {}, {"message": "Object does not exist"}
            if branch in self.branches.setdefault(repo, {}):
                return 422, {}, {"message": "Reference already exists"}
            self.branches[repo][branch] = sha
            return 201, {}, self._ref_json(repo, branch, sha)

    # --- pull requests --------------------------------------------------------------------------
    def _pull_json(self, repo: str, pr: dict[str, Any]) -> dict[str, Any]:
        owner = repo.split("/", 1)[0]
        number = pr["number"]
        url = f"{self.url}/repos/{repo}/pulls/{number}"

        def side(ref: str) -> dict[str, Any]:
            return {"label": f"{owner}:{ref}", "ref": ref, "sha": self.branches.get(repo, {}).get(ref),
                    "user": {"login": owner}, "repo": {"full_name": repo, "url": f"{self.url}/repos/{repo}"}}

        stamp = f"2024-01-01T00:00:{pr['updated'] % 60:02d}Z"
        return {"id": number + 5_000_000, "number": number, "state": pr["state"], "title": pr["title"],
                "body": pr["body"], "url": url, "html_url": f"{self.url}/{repo}/pull/{number}",
                "head": side(pr["head_ref"]), "base": side(pr["base_ref"]), "user": {"login": pr["user"]},
                "merged": pr["merged"], "merged_at": stamp if pr["merged"] else None,
                "closed_at": stamp if pr["state"] == "closed" else None,
                "created_at": "2024-01-01T00:00:00Z", "updated_at": stamp}

    def _head_ref(self, repo: str, head: str) -> str | None:
        """``branch`` or ``owner:branch`` of this repository (forks are not modelled)."""
        if ":" in head:
            owner, head = head.split(":", 1)
            if owner.lower() != repo.split("/", 1)[0]:
                return None
        return head

    def _on_pulls(self, params, repo, body):
        with self._lock:
            pulls = self.pulls.setdefault(repo, {})
            if params["method"] == "GET":
                query = params["query"]
                state = query.get("state", "open")
                head = self._head_ref(repo, query["head"]) if "head" in query else None
                chosen = [pr for pr in pulls.values()
                          if state in ("all", pr["state"]) and ("head" not in query or pr["head_ref"] == head)
                          and query.get("base", pr["base_ref"]) == pr["base_ref"]]
                key = "updated" if query.get("sort") == "updated" else "number"
                chosen.sort(key=lambda pr: pr[key], reverse=query.get("direction", "desc") == "desc")
                limit = int(query.get("per_page", 30))
                return 200, {}, [self._pull_json(repo, pr) for pr in chosen[:limit]]
            body = body if isinstance(body, dict) else {}
            head = self._head_ref(repo, body.get("head", ""))
            base = body.get("base", "")
            branches = self.branches.get(repo, {})
            invalid = [field for field, ref in (("head", head), ("base", base)) if ref not in branches]
            if invalid:
                return 422, {}, {"message": "Validation Failed", "errors": [
                    {"resource": "PullRequest", "field": field, "code": "invalid"} for field in invalid]}
            if any(pr["state"] == "open" and pr["head_ref"] == head and pr["base_ref"] == base for pr in pulls.values()):
                return 422, {}, {"message": "Validation Failed", "errors": [{
                    "resource": "PullRequest", "code": "custom",
                    "message": f"A pull request already exists for {repo.split('/')[0]}:{head}."}]}
            if branches[head] in self._ancestors(branches[base]):
                return 422, {}, {"message": "Validation Failed", "errors": [{
                    "resource": "PullRequest", "code": "custom", "message": f"No commits between {base} and {head}"}]}
            number = max(pulls, default=0) + 1
            pulls[number] = {"number": number, "title": body.get("title") or head, "body": body.get("body"),
                             "head_ref": head, "base_ref": base, "state": "open", "merged": False,
                             "user": "relay-bot", "updated": next(self._clock)}
            return 201, {}, self._pull_json(repo, pulls[number])

    def _on_pull(self, params, repo, body):
        with self._lock:
            pr = self.pulls.get(repo, {}).get(int(params["number"]))
            if pr is None:
                return 404, {}, {"message": "Not Found"}
            if params["method"] == "PATCH":
                body = body if isinstance(body, dict) else {}
                if body.get("state", "open") not in ("open", "closed"):
                    return 422, {}, {"message": "Validation Failed", "errors": [{"field": "state", "code": "invalid"}]}
                if pr["merged"] and body.get("state") == "open":
                    return 422, {}, {"message": "Validation Failed", "errors": [{
                        "resource": "PullRequest", "code": "custom", "message": "Cannot reopen a merged pull request"}]}
                pr.update({k: body[k] for k in ("title", "body", "state") if k in body}, updated=next(self._clock))
            return 200, {}, self._pull_json(repo, pr)


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
