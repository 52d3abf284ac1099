"""GitHub: the only module that talks to GitHub (through github3.py's session) and sorts its failures.

Triggered by the dispatcher (``repository_dispatch``) and by reporting (commit statuses, check
runs). Reads settings (API URL, token or GitHub App key); writes to GitHub. Every call returns a
:class:`CallResult` or raises one of three errors callers can act on without reading HTTP:

* :class:`RetryableError`: 5xx, timeouts, connection failures: try again later with backoff;
* :class:`RateLimitedError`: primary or secondary rate limit; ``wait_seconds`` says how long the
  credential must rest (``retry-after``, else ``x-ratelimit-reset``, else exponential from a minute);
* :class:`PermanentError`: 404, 422, 401 (revoked token), other 4xx: retrying cannot help.

Auth: a token (``RELAY_GITHUB_TOKEN``), or a GitHub App whose installation token is fetched per
downstream repository and refreshed before it expires. ``credential_for(repo)`` names the credential a
repository's calls are charged to, so that rate limits are honoured per credential.

Also triggered by the level-change proposals (:mod:`relay.levels.proposals`): a file's content at a ref, a
branch created or moved, a file updated on a branch (the contents API), the pull requests of a head
branch, a pull request opened or updated.

Calls go through the github3 session (``session.post`` etc.) rather than github3's object helpers:
``repository_dispatch`` has no helper, and the helpers for statuses and check runs would first fetch
the repository, doubling the requests that count against the limits.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import functools
import threading
import time
from collections.abc import Collection
from typing import Any, Protocol
from urllib.parse import quote

import github3
import jwt
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github3.apps import APP_PREVIEW_HEADERS
from github3.session import AppBearerTokenAuth
from requests.adapters import HTTPAdapter

__all__ = [
    "CallResult",
    "DispatchSender",
    "GitHubCallError",
    "GitHubClient",
    "InstallationToken",
    "PermanentError",
    "RateLimitedError",
    "RepositoryFile",
    "RetryableError",
]

# Refresh an installation token this long before GitHub says it expires (tokens live one hour).
TOKEN_REFRESH_MARGIN_SECONDS = 300.0
_APP_JWT_SECONDS = 540  # GitHub accepts app JWTs of at most 10 minutes
_INSTALLATION_JWT_SECONDS = 30  # the JWT that asks for an installation token is used once, at once
_SECONDARY_BACKOFF_CAP_SECONDS = 3600.0


class GitHubCallError(Exception):
    """A GitHub call that did not succeed; ``status`` is None for network failures."""

    kind = "error"

    def __init__(self, message: str, *, status: int | None = None, credential: str = ""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.credential = credential


class RetryableError(GitHubCallError):
    kind = "retryable"


class PermanentError(GitHubCallError):
    kind = "permanent"


class RateLimitedError(GitHubCallError):
    kind = "rate_limited"

    def __init__(self, message: str, *, wait_seconds: float, status: int | None = None, credential: str = ""):
        super().__init__(message, status=status, credential=credential)
        self.wait_seconds = wait_seconds


@dataclasses.dataclass(frozen=True)
class CallResult:
    status: int
    data: Any
    credential: str
    # Set when the primary limit is exhausted (x-ratelimit-remaining: 0): rest the credential this long.
    pause_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class InstallationToken:
    installation_id: int
    token: str = dataclasses.field(repr=False)
    expires_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class RepositoryFile:
    """A file as the contents API returns it: its path, blob sha (needed to update it) and bytes."""

    path: str
    sha: str
    content: bytes = dataclasses.field(repr=False)


class DispatchSender(Protocol):
    """What the dispatcher needs from GitHub (tests may pass any object with these methods)."""

    def credential_for(self, repository: str) -> str: ...

    def repository_dispatch(self, repository: str, event_type: str, client_payload: dict[str, Any]) -> CallResult: ...


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return (response.text or response.reason or "").strip()[:300]
    if isinstance(body, dict):
        text = str(body.get("message") or "")
        errors = body.get("errors")
        if errors:
            text += f" ({errors})"[:300]
        return text
    return str(body)[:300]


@functools.lru_cache(maxsize=8)
def _app_key(private_key_pem: str | bytes) -> rsa.RSAPrivateKey:
    """The App's private key, parsed and checked once (a key that cannot sign fails here, at start-up,
    rather than at the first dispatch). Checking an RSA key tests its primes, tens of milliseconds: a
    process that builds several clients of one App (the relay's tests build many) does it once."""
    pem = private_key_pem.encode() if isinstance(private_key_pem, str) else private_key_pem
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the GitHub App private key is not an unencrypted PEM private key ({exc}); "
                         "use the .pem file downloaded from the App's settings page") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("the GitHub App private key is not an RSA key, and GitHub signs App JWTs with RS256: "
                         "use the .pem file downloaded from the App's settings page")
    return key


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class GitHubClient:
    """GitHubClient(api_url, token=... | app_id=..., private_key_pem=...): typed GitHub calls.

    Thread-safe: the dispatcher calls it from many threads at once.
    """

    def __init__(
        self,
        api_url: str = "https://api.github.com",
        *,
        token: str | None = None,
        app_id: str | None = None,
        private_key_pem: str | None = None,
        timeout: float = 10.0,
        secondary_backoff_seconds: float = 60.0,
        pool_size: int = 32,
        token_refresh_margin_seconds: float = TOKEN_REFRESH_MARGIN_SECONDS,
        clock=time.time,
    ):
        if (token is None) == (app_id is None):
            raise ValueError("GitHubClient needs either token= or app_id= with private_key_pem=")
        if app_id is not None and not private_key_pem:
            raise ValueError("GitHub App auth needs private_key_pem")
        self.api_url = api_url.rstrip("/")
        self._token = token
        # The App JWTs carry it as their issuer, which PyJWT accepts only as a string.
        self._app_id = None if app_id is None else str(app_id)
        self._app_key = None if app_id is None else _app_key(private_key_pem)
        self._timeout = timeout
        self._secondary_base = secondary_backoff_seconds
        self._pool_size = pool_size
        self._refresh_margin = token_refresh_margin_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._token_client: github3.GitHub | None = None
        self._installations: dict[str, int] = {}  # repository -> installation id
        self._installation_clients: dict[int, tuple[github3.GitHub, dt.datetime]] = {}
        self._installation_locks: dict[int, threading.Lock] = {}
        self._secondary_hits: dict[str, int] = {}

    @classmethod
    def from_settings(cls, settings) -> "GitHubClient":
        common = dict(
            timeout=settings.github_timeout_seconds,
            secondary_backoff_seconds=settings.github_secondary_backoff_seconds,
            pool_size=settings.dispatch_concurrency,
        )
        if settings.uses_github_app:
            try:
                return cls(
                    settings.github_api_url, app_id=settings.github_app_id,
                    private_key_pem=settings.github_private_key_file.read_text(), **common,
                )
            except ValueError as exc:
                raise ValueError(f"RELAY_GITHUB_PRIVATE_KEY_FILE ({settings.github_private_key_file}): {exc}") from None
        return cls(settings.github_api_url, token=settings.github_token.get_secret_value(), **common)

    # --- sessions ---------------------------------------------------------------------------------
    def _new_client(self) -> github3.GitHub:
        gh = github3.GitHub()
        gh.session.base_url = self.api_url
        gh.session.default_connect_timeout = self._timeout
        gh.session.default_read_timeout = self._timeout
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=self._pool_size)
        gh.session.mount("http://", adapter)
        gh.session.mount("https://", adapter)
        return gh

    def _client_for(self, repository: str) -> tuple[github3.GitHub, str]:
        if self._token is not None:
            with self._lock:
                if self._token_client is None:
                    self._token_client = self._new_client()
                    self._token_client.login(token=self._token)
                return self._token_client, "token"
        installation_id = self._installation_id(repository)
        return self._installation_client(installation_id), f"installation:{installation_id}"

    def _app_jwt(self, seconds: int) -> str:
        """A JWT that authenticates as the App for ``seconds``, signed with the key parsed once: github3's
        ``login_as_app*`` take the PEM and have PyJWT parse and check it again for every token, about
        40 ms of CPU each."""
        now = int(time.time())  # GitHub checks it against its own clock, not the injectable one
        return jwt.encode({"iat": now, "exp": now + seconds, "iss": self._app_id}, self._app_key, algorithm="RS256")

    def _app_client(self) -> github3.GitHub:
        gh = self._new_client()
        gh.session.app_bearer_token_auth(self._app_jwt(_APP_JWT_SECONDS), _APP_JWT_SECONDS)
        return gh

    def _log_in_as_installation(self, gh: github3.GitHub, installation_id: int, credential: str, what: str) -> None:
        """What github3's ``login_as_app_installation`` does: trade an App JWT for an installation token,
        then authenticate ``gh``'s session with it."""
        url = f"{self.api_url}/app/installations/{installation_id}/access_tokens"
        auth = AppBearerTokenAuth(self._app_jwt(_INSTALLATION_JWT_SECONDS), _INSTALLATION_JWT_SECONDS)
        with gh.session.no_auth():
            response = gh.session.post(url, auth=auth, headers=APP_PREVIEW_HEADERS)
        if response.status_code != 201:
            self._raise_for(response, credential, what)
        gh.session.app_installation_token_auth(response.json())

    def _installation_id(self, repository: str) -> int:
        with self._lock:
            known = self._installations.get(repository.lower())
        if known is not None:
            return known
        owner, name = repository.split("/", 1)
        installation = self._call(
            "app", lambda: self._app_client().app_installation_for_repository(owner, name),
            what=f"find the GitHub App installation of {repository}",
        )
        if installation is None:
            raise PermanentError(f"the GitHub App is not installed on {repository}", status=404, credential="app")
        with self._lock:
            self._installations[repository.lower()] = installation.id
        return installation.id

    def _installation_client(self, installation_id: int) -> github3.GitHub:
        with self._lock:
            lock = self._installation_locks.setdefault(installation_id, threading.Lock())
        with lock:  # one refresh per installation at a time
            cached = self._installation_clients.get(installation_id)
            now = dt.datetime.fromtimestamp(self._clock(), dt.timezone.utc)
            if cached is not None and (cached[1] - now).total_seconds() > self._refresh_margin:
                return cached[0]
            gh = self._new_client()
            credential, what = f"installation:{installation_id}", f"fetch an installation token for installation {installation_id}"
            self._call(credential, lambda: self._log_in_as_installation(gh, installation_id, credential, what), what=what)
            expires_at = gh.session.auth.expires_at
            self._installation_clients[installation_id] = (gh, expires_at)
            return gh

    def installation_token(self, repository: str) -> InstallationToken:
        """installation_token(repo) -> the current (refreshed if needed) token for ``repo``'s installation."""
        if self._app_id is None:
            raise PermanentError("installation tokens need GitHub App auth (RELAY_GITHUB_APP_ID)")
        installation_id = self._installation_id(repository)
        gh = self._installation_client(installation_id)
        return InstallationToken(installation_id, gh.session.auth.token, gh.session.auth.expires_at)

    def _forget_installation_token(self, credential: str) -> None:
        if credential.startswith("installation:"):
            with self._lock:
                self._installation_clients.pop(int(credential.split(":", 1)[1]), None)

    def credential_for(self, repository: str) -> str:
        """The credential calls for ``repository`` are charged to ("token" or "installation:<id>")."""
        if self._token is not None:
            return "token"
        return f"installation:{self._installation_id(repository)}"

    # --- classification ---------------------------------------------------------------------------
    def _call(self, credential: str, fn, *, what: str):
        """Run a github3 call, turning its exceptions into the three error kinds."""
        try:
            return fn()
        except github3.exceptions.GitHubError as exc:
            response = getattr(exc, "response", None)
            if response is None:
                raise RetryableError(f"{what}: {exc}", credential=credential) from None
            self._raise_for(response, credential, what)
        except requests.RequestException as exc:
            raise RetryableError(f"{what}: network error: {type(exc).__name__}", credential=credential) from None

    def _raise_for(self, response: requests.Response, credential: str, what: str) -> None:
        status = response.status_code
        message = _message(response)
        headers = response.headers
        detail = f"{what}: {status} {message}".strip()
        if status in (403, 429):
            retry_after = _number(headers.get("retry-after"))
            remaining = headers.get("x-ratelimit-remaining")
            reset = _number(headers.get("x-ratelimit-reset"))
            if retry_after is not None:
                raise RateLimitedError(detail, wait_seconds=max(retry_after, 0.0), status=status, credential=credential)
            if remaining == "0" and reset is not None:
                wait = max(reset - self._clock(), 1.0)
                raise RateLimitedError(detail, wait_seconds=wait, status=status, credential=credential)
            lowered = message.lower()
            if status == 429 or "rate limit" in lowered or "abuse" in lowered:
                with self._lock:
                    hits = self._secondary_hits.get(credential, 0)
                    self._secondary_hits[credential] = hits + 1
                wait = min(self._secondary_base * 2**hits, _SECONDARY_BACKOFF_CAP_SECONDS)
                raise RateLimitedError(detail, wait_seconds=wait, status=status, credential=credential)
            raise PermanentError(detail, status=status, credential=credential)
        if status == 401:
            self._forget_installation_token(credential)
            raise PermanentError(f"{detail} (the token is revoked, expired or wrong)", status=status, credential=credential)
        if status >= 500 or status == 408:
            raise RetryableError(detail, status=status, credential=credential)
        raise PermanentError(detail, status=status, credential=credential)

    def _request(self, method: str, repository: str, path: str, expect: int | Collection[int], *, what: str,
                 json: Any = None, params: dict[str, Any] | None = None) -> CallResult:
        gh, credential = self._client_for(repository)
        url = f"{self.api_url}/repos/{repository}/{path}"
        expected = (expect,) if isinstance(expect, int) else tuple(expect)
        try:
            response = gh.session.request(method, url, json=json, params=params, timeout=(self._timeout, self._timeout))
        except requests.RequestException as exc:
            raise RetryableError(f"{what}: network error: {type(exc).__name__}", credential=credential) from None
        if response.status_code not in expected:
            if 200 <= response.status_code < 300:
                raise PermanentError(f"{what}: expected {' or '.join(map(str, expected))}, got {response.status_code}", status=response.status_code, credential=credential)
            self._raise_for(response, credential, what)
        with self._lock:
            self._secondary_hits.pop(credential, None)
        pause = None
        if response.headers.get("x-ratelimit-remaining") == "0":
            reset = _number(response.headers.get("x-ratelimit-reset"))
            if reset is not None:
                pause = max(reset - self._clock(), 0.0)
        data = None
        if response.content:
            try:
                data = response.json()
            except ValueError:
                data = None
        return CallResult(status=response.status_code, data=data, credential=credential, pause_seconds=pause)

    # --- typed calls ------------------------------------------------------------------------------
    def repository_dispatch(self, repository: str, event_type: str, client_payload: dict[str, Any]) -> CallResult:
        """POST /repos/{repo}/dispatches; GitHub answers 204 and no run id."""
        return self._request(
            "POST", repository, "dispatches", 204, what=f"repository_dispatch to {repository}",
            json={"event_type": event_type, "client_payload": client_payload},
        )

    def create_status(
        self, repository: str, sha: str, state: str, *, context: str, description: str | None = None,
        target_url: str | None = None,
    ) -> CallResult:
        """POST /repos/{repo}/statuses/{sha}; ``state`` is pending|success|error|failure (201)."""
        if state not in ("pending", "success", "error", "failure"):
            raise ValueError(f"commit status state {state!r}; use pending, success, error or failure")
        body = {"state": state, "context": context}
        if description is not None:
            body["description"] = description[:140]
        if target_url is not None:
            body["target_url"] = target_url
        return self._request("POST", repository, f"statuses/{sha}", 201, what=f"status on {repository}@{sha[:12]}", json=body)

    def create_check_run(self, repository: str, *, name: str, head_sha: str, **fields: Any) -> CallResult:
        """POST /repos/{repo}/check-runs (GitHub App auth only); ``data["id"]`` is the run's id (201)."""
        body = {"name": name, "head_sha": head_sha, **{k: v for k, v in fields.items() if v is not None}}
        return self._request("POST", repository, "check-runs", 201, what=f"check run {name!r} on {repository}", json=body)

    def update_check_run(self, repository: str, check_run_id: int, **fields: Any) -> CallResult:
        """PATCH /repos/{repo}/check-runs/{id} (200)."""
        body = {k: v for k, v in fields.items() if v is not None}
        return self._request(
            "PATCH", repository, f"check-runs/{check_run_id}", 200, what=f"check run {check_run_id} on {repository}", json=body,
        )

    # --- files, branches and pull requests (level-change proposals) ------------------------------
    def _found(self, call) -> CallResult | None:
        """The call's result, or None where GitHub answers 404 (no such file, branch or pull request)."""
        try:
            return call()
        except PermanentError as exc:
            if exc.status == 404:
                return None
            raise

    def file_at(self, repository: str, path: str, ref: str) -> RepositoryFile | None:
        """GET /repos/{repo}/contents/{path}?ref= -> the file (None: no such file or ref)."""
        found = self._found(lambda: self._request(
            "GET", repository, f"contents/{quote(path)}", 200, what=f"read {path} at {ref} of {repository}",
            params={"ref": ref},
        ))
        if found is None:
            return None
        data = found.data if isinstance(found.data, dict) else {}
        if data.get("type") != "file" or data.get("encoding") != "base64":
            raise PermanentError(f"{path} at {ref} of {repository} is not a file GitHub returns in base64",
                                 status=found.status, credential=found.credential)
        return RepositoryFile(path=data["path"], sha=data["sha"], content=base64.b64decode(data["content"]))

    def branch_head(self, repository: str, branch: str) -> str | None:
        """GET /repos/{repo}/git/ref/heads/{branch} -> the commit the branch points at (None: no such branch)."""
        found = self._found(lambda: self._request(
            "GET", repository, f"git/ref/heads/{quote(branch)}", 200, what=f"read branch {branch} of {repository}",
        ))
        return None if found is None else found.data["object"]["sha"]

    def create_branch(self, repository: str, branch: str, sha: str) -> CallResult:
        """POST /repos/{repo}/git/refs: a new branch at commit ``sha`` (201; 422 when it exists)."""
        return self._request("POST", repository, "git/refs", 201, what=f"create branch {branch} on {repository}",
                             json={"ref": f"refs/heads/{branch}", "sha": sha})

    def move_branch(self, repository: str, branch: str, sha: str, *, force: bool = False) -> CallResult:
        """PATCH /repos/{repo}/git/refs/heads/{branch}: point it at ``sha`` (``force``: even if not a fast-forward)."""
        return self._request("PATCH", repository, f"git/refs/heads/{quote(branch)}", 200,
                             what=f"move branch {branch} of {repository}", json={"sha": sha, "force": force})

    def put_file(self, repository: str, path: str, *, content: bytes, message: str, branch: str,
                 sha: str | None) -> CallResult:
        """PUT /repos/{repo}/contents/{path}: commit ``content`` on ``branch``; ``sha`` is the blob replaced
        (None: a new file). 200 on update, 201 on create; ``data["commit"]["sha"]`` is the new commit."""
        body: dict[str, Any] = {"message": message, "content": base64.b64encode(content).decode(), "branch": branch}
        if sha is not None:
            body["sha"] = sha
        return self._request("PUT", repository, f"contents/{quote(path)}", (200, 201),
                             what=f"commit {path} on {branch} of {repository}", json=body)

    def pull_requests_from(self, repository: str, branch: str, *, base: str, limit: int = 5) -> list[dict[str, Any]]:
        """GET /repos/{repo}/pulls?state=all&head=owner:branch: the newest pull requests from ``branch`` of the
        same repository into ``base``, newest first (open and closed; ``merged_at`` set on merged ones)."""
        owner = repository.split("/", 1)[0]
        found = self._request(
            "GET", repository, "pulls", 200, what=f"list pull requests from {branch} on {repository}",
            params={"state": "all", "head": f"{owner}:{branch}", "base": base, "sort": "created",
                    "direction": "desc", "per_page": limit},
        )
        return list(found.data or [])

    def create_pull_request(self, repository: str, *, title: str, head: str, base: str, body: str) -> CallResult:
        """POST /repos/{repo}/pulls (201; ``data["number"]``, ``data["html_url"]``)."""
        return self._request("POST", repository, "pulls", 201, what=f"open a pull request from {head} on {repository}",
                             json={"title": title, "head": head, "base": base, "body": body})

    def update_pull_request(self, repository: str, number: int, **fields: Any) -> CallResult:
        """PATCH /repos/{repo}/pulls/{number}: ``title``, ``body``, ``state`` (open|closed) (200)."""
        body = {k: v for k, v in fields.items() if v is not None}
        return self._request("PATCH", repository, f"pulls/{number}", 200,
                             what=f"update pull request #{number} on {repository}", json=body)
