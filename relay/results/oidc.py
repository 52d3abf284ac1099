"""Callback authentication: who is calling back, proven by a GitHub Actions OIDC token or a static token.

Triggered by every ``POST /github/callback`` (the :func:`relay.results.routes.verified_caller` dependency calls
:meth:`CallerAuth.authenticate` before the handler body runs). Reads the ``Authorization`` header, the
issuer's JWKS (fetched over HTTPS, cached, refetched when a token names an unknown key id) and the
allowlist's backend targets (:mod:`relay.trust`); writes nothing.

Two ways in:

* ``Authorization: Bearer <OIDC token>``: an RS256 JWT from ``RELAY_OIDC_ISSUER`` (GitHub Actions:
  ``https://token.actions.githubusercontent.com``) for audience ``RELAY_OIDC_AUDIENCE``; signature
  checked against the issuer's JWKS; ``exp``, ``nbf`` and ``iat`` checked (with a small leeway);
  ``alg: none`` and every HMAC or other algorithm refused before any key is looked at. The token's
  ``repository`` claim names the caller.
* ``Authorization: Token <secret>``: for CI systems without OIDC, a per-backend secret whose sha256
  hex digest is the backend file's ``relay.callback_token_sha256``. Compared in constant time against
  every backend's digest, so timing reveals neither which backend nor how much matched.

Either way the caller must be an allowlisted backend whose level accepts results
(``BackendTarget.accepts_results``: L2 and up in the levels table; L1 backends receive events but send
nothing back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
import jwt

from relay.trust import BackendTarget, lowest_accepting_results

__all__ = [
    "AuthError",
    "Caller",
    "CallerAuth",
    "JwksCache",
    "OidcVerifier",
]

log = logging.getLogger("relay.oidc")

GITHUB_ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"
_ACCEPTED_ALGORITHMS = ("RS256",)


class AuthError(Exception):
    """The caller is not who the relay accepts; ``status`` is 401 (no valid proof) or 403 (not allowed)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class Caller:
    """A verified caller: the backend, how it proved itself, and the run its OIDC token names."""

    target: BackendTarget
    method: str  # "oidc" | "token"
    run_id: int | None = None
    run_attempt: int | None = None

    @property
    def backend(self) -> str:
        return self.target.name

    @property
    def repository(self) -> str:
        return self.target.repository


class JwksCache:
    """JwksCache(issuer, jwks_url=None): the issuer's signing keys by key id, fetched lazily.

    The JWKS URL comes from the issuer's ``/.well-known/openid-configuration`` unless given. Keys
    are kept for ``max_age_seconds``; a token naming an unknown ``kid`` triggers one refetch (GitHub
    rotates its keys), at most once per ``min_refresh_seconds`` so that forged key ids cannot make
    the relay hammer the issuer.
    """

    def __init__(
        self, issuer: str, *, jwks_url: str | None = None, max_age_seconds: float = 3600.0,
        min_refresh_seconds: float = 30.0, timeout: float = 5.0, clock=time.monotonic,
    ):
        self.issuer = issuer.rstrip("/")
        self._jwks_url = jwks_url
        self._max_age = max_age_seconds
        self._min_refresh = min_refresh_seconds
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None
        self.fetches = 0

    def _discover(self, client: httpx.Client) -> str:
        if self._jwks_url is None:
            response = client.get(f"{self.issuer}/.well-known/openid-configuration")
            response.raise_for_status()
            uri = response.json().get("jwks_uri")
            if not isinstance(uri, str):
                raise ValueError(f"{self.issuer}'s openid-configuration has no jwks_uri")
            self._jwks_url = uri
        return self._jwks_url

    def _fetch(self) -> None:
        with httpx.Client(timeout=self._timeout) as client:
            response = client.get(self._discover(client))
            response.raise_for_status()
            keys = {}
            for jwk in response.json().get("keys", []):
                if jwk.get("kty") == "RSA" and jwk.get("kid"):
                    keys[jwk["kid"]] = jwt.PyJWK.from_dict(jwk, algorithm="RS256").key
        self._keys = keys
        self._fetched_at = self._clock()
        self.fetches += 1

    def key(self, kid: str):
        """The public key for ``kid``, refetching the JWKS once if it is unknown or stale; None if absent."""
        with self._lock:
            now = self._clock()
            stale = self._fetched_at is None or now - self._fetched_at > self._max_age
            may_refresh = self._fetched_at is None or now - self._fetched_at >= self._min_refresh
            if stale or (kid not in self._keys and may_refresh):
                try:
                    self._fetch()
                except (httpx.HTTPError, ValueError) as exc:
                    if not self._keys:
                        raise AuthError(
                            401, "jwks_unavailable",
                            f"cannot fetch the signing keys of {self.issuer}: {type(exc).__name__}; try again later",
                        ) from None
                    log.warning("JWKS refresh failed; using cached keys", extra={"issuer": self.issuer,
                                                                                 "error": type(exc).__name__})
            return self._keys.get(kid)


class OidcVerifier:
    """OidcVerifier(issuer, audience, jwks): verifies an OIDC token and returns its claims."""

    def __init__(self, issuer: str, audience: str, jwks: JwksCache | None = None, *, leeway_seconds: float = 60.0,
                 max_lifetime_seconds: float = 3600.0, clock=time.time):
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self.jwks = jwks or JwksCache(issuer)
        self._leeway = leeway_seconds
        self._max_lifetime = max_lifetime_seconds  # exp - iat; GitHub's tokens live minutes
        self._clock = clock

    def verify(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise AuthError(401, "malformed_token", f"the bearer token is not a JWT: {exc}") from None
        alg = header.get("alg")
        # Refuse before looking up any key: "none" carries no signature, and HMAC would let anyone who
        # knows the (public) RSA key forge tokens if a library ever used it as an HMAC secret.
        if alg not in _ACCEPTED_ALGORITHMS:
            raise AuthError(401, "algorithm_refused", f"token algorithm {alg!r} is refused; only RS256 is accepted")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AuthError(401, "missing_key_id", "the token header has no 'kid' (key id)")
        key = self.jwks.key(kid)
        if key is None:
            raise AuthError(401, "unknown_key_id", f"key id {kid!r} is not in {self.issuer}'s JWKS")
        try:
            claims = jwt.decode(
                token, key, algorithms=list(_ACCEPTED_ALGORITHMS), audience=self.audience, issuer=self.issuer,
                leeway=self._leeway, options={"require": ["exp", "iat", "nbf", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError(401, "token_expired", "the OIDC token has expired; request a fresh one") from None
        except jwt.ImmatureSignatureError:
            raise AuthError(401, "token_not_yet_valid", "the OIDC token is not valid yet (nbf/iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise AuthError(
                401, "wrong_audience",
                f"the OIDC token's audience is not {self.audience!r}; request the token with that audience",
            ) from None
        except jwt.InvalidIssuerError:
            raise AuthError(401, "wrong_issuer", f"the OIDC token was not issued by {self.issuer}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(401, "missing_claim", f"the OIDC token lacks the {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(401, "invalid_token", f"the OIDC token is invalid: {exc}") from None
        iat = claims.get("iat")
        if not isinstance(iat, (int, float)) or iat > self._clock() + self._leeway:
            raise AuthError(401, "token_not_yet_valid", "the OIDC token's iat is in the future")
        lifetime = claims["exp"] - iat if isinstance(claims.get("exp"), (int, float)) else None
        if lifetime is None or lifetime > self._max_lifetime:
            raise AuthError(
                401, "token_lifetime_too_long",
                f"the OIDC token is valid for {lifetime} s from iat to exp; at most {self._max_lifetime:.0f} s is accepted",
            )
        if not isinstance(claims.get("repository"), str):
            raise AuthError(401, "missing_claim", "the OIDC token lacks the 'repository' claim")
        for name in ("repository_id", "repository_owner_id"):
            if _int_claim(claims, name) is None:
                raise AuthError(401, "missing_claim", f"the OIDC token lacks a numeric {name!r} claim")
        return claims


def _int_claim(claims: Mapping[str, Any], name: str) -> int | None:
    value = claims.get(name)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class CallerAuth:
    """CallerAuth(targets, verifier=None): turns an ``Authorization`` header into a :class:`Caller`."""

    def __init__(self, targets: Iterable[BackendTarget], verifier: OidcVerifier | None = None, *, identities=None):
        self.targets = tuple(targets)
        self.verifier = verifier
        # identities.pin_oidc_identity(backend, repository_id, owner_id) -> pinned ids (the store); used
        # for a backend whose relay section records no ids. None: ids are checked only where recorded.
        self.identities = identities
        self._by_repository = {t.repository.lower(): t for t in self.targets}

    def use(self, targets: Iterable[BackendTarget]) -> None:
        """Authenticate against ``targets`` from now on (a descriptor reload)."""
        targets = tuple(targets)
        self._by_repository = {t.repository.lower(): t for t in targets}
        self.targets = targets

    def authenticate(self, authorization: str | None) -> Caller:
        if not authorization:
            raise AuthError(
                401, "missing_credentials",
                "no Authorization header: send 'Bearer <GitHub Actions OIDC token>' or 'Token <backend callback token>'",
            )
        scheme, _, credential = authorization.strip().partition(" ")
        credential = credential.strip()
        if not credential:
            raise AuthError(401, "missing_credentials", f"the Authorization header has scheme {scheme!r} but no credential")
        if scheme.lower() == "bearer":
            return self._from_oidc(credential)
        if scheme.lower() == "token":
            return self._from_static_token(credential)
        raise AuthError(401, "unknown_scheme", f"Authorization scheme {scheme!r} is not accepted; use Bearer or Token")

    def _from_oidc(self, token: str) -> Caller:
        if self.verifier is None:
            raise AuthError(401, "oidc_not_configured", "OIDC callbacks are off on this relay (RELAY_OIDC_AUDIENCE is unset)")
        claims = self.verifier.verify(token)
        repository = claims["repository"]
        target = self._by_repository.get(repository.lower())
        if target is None:
            raise AuthError(403, "not_allowlisted", f"repository {repository!r} is not an allowlisted backend repository")
        self._check_level(target)
        self._check_identity(target, claims)
        return Caller(
            target, "oidc",
            run_id=_int_claim(claims, "run_id"), run_attempt=_int_claim(claims, "run_attempt"),
        )

    def _from_static_token(self, token: str) -> Caller:
        digest = hashlib.sha256(token.encode()).hexdigest()
        found = None
        for target in self.targets:  # every digest is compared: no early exit, so timing says nothing
            expected = target.callback_token_sha256
            if hmac.compare_digest(digest, expected or "0" * 64) and expected:
                found = target
        if found is None:
            raise AuthError(401, "bad_token", "the callback token matches no backend")
        self._check_level(found)
        return Caller(found, "token")

    def _check_identity(self, target: BackendTarget, claims: Mapping[str, Any]) -> None:
        """The token's numeric repository ids are the backend's (recorded, or pinned at its first
        callback), and its workflow_ref is the one the relay section names, if it names one."""
        given = (_int_claim(claims, "repository_id"), _int_claim(claims, "repository_owner_id"))
        if target.repository_id is not None or target.repository_owner_id is not None:
            expected, source = (target.repository_id, target.repository_owner_id), "recorded in its relay section"
        elif self.identities is not None:
            expected, source = self.identities.pin_oidc_identity(target.name, *given), "pinned at its first callback"
        else:
            expected, source = (None, None), ""
        for name, want, got in zip(("repository_id", "repository_owner_id"), expected, given):
            if want is not None and want != got:
                raise AuthError(
                    403, "repository_identity_mismatch",
                    f"the OIDC token for {target.repository} carries {name} {got}, but backend {target.name!r} has "
                    f"{want} ({source}): the repository name now belongs to another repository or owner",
                )
        if target.workflow_ref is not None and claims.get("workflow_ref") != target.workflow_ref:
            raise AuthError(
                403, "workflow_mismatch",
                f"the OIDC token was issued to workflow {str(claims.get('workflow_ref'))[:300]!r}; backend "
                f"{target.name!r} accepts callbacks only from {target.workflow_ref!r} (relay.workflow_ref)",
            )

    @staticmethod
    def _check_level(target: BackendTarget) -> None:
        if not target.accepts_results:
            lowest = lowest_accepting_results()
            accepted = f"results are accepted from {lowest.value} up" if lowest else "no level accepts results"
            raise AuthError(
                403, "level_too_low",
                f"backend {target.name!r} ({target.repository}) is at level {target.level.value}: {accepted}; "
                "promote it in its backend file",
            )

