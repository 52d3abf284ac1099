"""The fake GitHub's apps area: the GitHub App side: an installation per repository, installation tokens, the repository itself, and who may call.

A mixin of :class:`relay.testing.fake_github.server.FakeGitHub`, whose ``__init__`` makes the state it
uses and whose ``handle`` calls its ``_on_<endpoint>`` answers.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from typing import Any


class GitHubApps:
    """Installations, installation tokens and the repository endpoint; the credential checks ``handle`` runs."""

    def install_app(self, repository: str, installation_id: int | None = None) -> int:
        installation_id = installation_id or next(self._ids)
        self.installations[repository.lower()] = installation_id
        return installation_id

    def revoke(self, token: str) -> None:
        self.revoked.add(token)

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
