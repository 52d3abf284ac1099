"""A fake OIDC issuer on 127.0.0.1 that mints GitHub-Actions-like tokens, for callback tests.

Started by a test (``with FakeOidcIssuer() as issuer: ...``); serves
``/.well-known/openid-configuration`` and ``/.well-known/jwks`` over real HTTP, so the relay's JWKS
cache fetches keys exactly as from ``token.actions.githubusercontent.com`` (point
``RELAY_OIDC_ISSUER`` at ``issuer.url``). ``mint(repository, audience)`` signs an RS256 token with the
claims GitHub sets (repository, run_id, run_attempt, ...); keyword arguments override or add claims,
``kid``/``key``/``algorithm`` forge bad ones, ``omit`` drops claims. ``rotate()`` publishes a new key (old ones stay served).
``jwks_requests`` counts key fetches.

It also plays the runner's token service: ``actions_token_env(repository, run_id=..)`` returns the
``ACTIONS_ID_TOKEN_REQUEST_URL``/``_TOKEN`` pair a job sees; ``GET`` of that URL with
``Authorization: bearer <request token>`` and ``&audience=...`` answers ``{"value": <token>}`` minted
for that repository and run (``token_requests`` records each audience asked for).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
import uuid
import zlib
from http.server import BaseHTTPRequestHandler
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from relay.testing.loopback import LoopbackServer

__all__ = ["FakeOidcIssuer", "new_rsa_key"]


# The keys of issuers that have stopped, for later ones: a 2048-bit RSA key costs about 0.1 s of CPU to
# generate, and the tests start hundreds of issuers. A key goes back here only when its issuer stops, so no two
# live issuers (nor a key forged with ``new_rsa_key``, never given back) ever share one.
_SPARE_KEYS: list[Any] = []


def new_rsa_key():
    """A 2048-bit RSA private key that no running issuer holds: a spare one, else a new one."""
    try:
        return _SPARE_KEYS.pop()
    except IndexError:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeOidcIssuer(LoopbackServer):
    def __init__(self):
        self.keys: dict[str, Any] = {}
        self.current_kid = ""
        self.jwks_requests = 0
        self.token_requests: list[str] = []
        self._actions: dict[str, dict[str, Any]] = {}  # request token -> the job it stands for
        self.rotate()

    def actions_token_env(self, repository: str, *, run_id: int = 1001, run_attempt: int = 1,
                          **claims: Any) -> dict[str, str]:
        """The token-request environment of a job of ``repository`` (what ``id-token: write`` gives it)."""
        request_token = secrets.token_urlsafe(24)
        self._actions[request_token] = dict(repository=repository, run_id=run_id, run_attempt=run_attempt, **claims)
        return {"ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.url}/actions/id-token?api-version=2.0",
                "ACTIONS_ID_TOKEN_REQUEST_TOKEN": request_token}

    def rotate(self) -> str:
        """Publish a new signing key and sign with it from now on; returns its key id."""
        kid = uuid.uuid4().hex[:16]
        self.keys[kid] = new_rsa_key()
        self.current_kid = kid
        return kid

    def start(self):
        if not self.keys:  # stopped before: its keys went to later issuers
            self.rotate()
        return super().start()

    def stop(self) -> None:
        running = self._server is not None
        super().stop()
        if running:  # its keys are no longer served or signed with: later issuers may have them
            _SPARE_KEYS.extend(self.keys.values())
            self.keys = {}

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, key in self.keys.items():
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def mint(self, repository: str, audience: str, *, run_id: int = 1001, run_attempt: int = 1,
             lifetime: float = 300, now: float | None = None, kid: str | None = None, key=None,
             algorithm: str = "RS256", issuer: str | None = None, omit: tuple[str, ...] = (), **claims: Any) -> str:
        now = time.time() if now is None else now
        body = {
            "iss": issuer or self.url, "aud": audience, "sub": f"repo:{repository}:ref:refs/heads/main",
            "repository": repository, "repository_owner": repository.split("/")[0], "run_id": str(run_id),
            "run_attempt": str(run_attempt), "workflow": "conformance", "event_name": "repository_dispatch",
            # GitHub's numeric ids; here stable numbers derived from the names.
            "repository_id": str(zlib.crc32(repository.lower().encode()) + 1),
            "repository_owner_id": str(zlib.crc32(repository.split("/")[0].lower().encode()) + 1),
            "workflow_ref": f"{repository}/.github/workflows/conformance.yml@refs/heads/main",
            "iat": int(now), "nbf": int(now) - 5, "exp": int(now + lifetime), "jti": uuid.uuid4().hex,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if k not in omit}
        kid = kid or self.current_kid
        if algorithm == "none":
            return jwt.encode(body, None, algorithm="none", headers={"kid": kid})
        if algorithm.startswith("HS"):
            return jwt.encode(body, key or "a-shared-secret-" * 4, algorithm=algorithm, headers={"kid": kid})
        return jwt.encode(body, key or self.keys[self.current_kid], algorithm=algorithm, headers={"kid": kid})

    def handler(self) -> type[BaseHTTPRequestHandler]:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and the
            # client's delayed ACK add ~40 ms to every answer on loopback.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.startswith("/actions/id-token?"):
                    return self._actions_token()
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/.well-known/jwks"}
                elif self.path == "/.well-known/jwks":
                    issuer.jwks_requests += 1
                    body = issuer.jwks()
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _actions_token(self):
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                scheme, _, request_token = self.headers.get("Authorization", "").partition(" ")
                job = issuer._actions.get(request_token) if scheme.lower() == "bearer" else None
                if job is None or "audience" not in query:
                    status, body = 401 if job is None else 400, {"message": "bad request token or no audience"}
                else:
                    issuer.token_requests.append(query["audience"])
                    status, body = 200, {"value": issuer.mint(audience=query["audience"], **job)}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
