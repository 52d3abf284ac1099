"""Callback authentication (relay.oidc) against a real JWKS endpoint on 127.0.0.1 (FakeOidcIssuer):
valid, expired, not yet valid, wrong audience, wrong issuer, unknown key id, key rotation, alg none,
HMAC, a forged signature, a repository not allowlisted, an L1 repository; static tokens."""

import hashlib
import time

import pytest

from conformance.descriptors import TrustLevel
from relay.results.oidc import AuthError, CallerAuth, JwksCache, OidcVerifier
from relay.trust import BackendTarget, load_allowlist
from relay.testing.oidc_issuer import new_rsa_key
from tests.relay.results_fixtures import oidc_issuer, results_backends  # noqa: F401 (fixtures)
from tests.relay.results_support import AUDIENCE, TOKENS


def _digest(name: str) -> str:
    return hashlib.sha256(TOKENS[name].encode()).hexdigest()


TARGETS = (
    BackendTarget("l1", "org/l1-ci", TrustLevel.L1, "ciflow/crcr/l1", callback_token_sha256=_digest("l1")),
    BackendTarget("l2", "org/l2-ci", TrustLevel.L2, "ciflow/crcr/l2", callback_token_sha256=_digest("l2")),
    BackendTarget("l4", "Org/L4-CI", TrustLevel.L4, "ciflow/crcr/l4"),
)


@pytest.fixture
def auth(oidc_issuer):  # noqa: F811
    verifier = OidcVerifier(oidc_issuer.url, AUDIENCE, JwksCache(oidc_issuer.url, min_refresh_seconds=0))
    return CallerAuth(TARGETS, verifier)


def refused(auth, header, status, code):
    with pytest.raises(AuthError) as info:
        auth.authenticate(header)
    assert (info.value.status, info.value.code) == (status, code), info.value.message
    return info.value.message


def test_valid_token_names_backend_and_run(auth, oidc_issuer):  # noqa: F811
    caller = auth.authenticate("Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE, run_id=77, run_attempt=3))
    assert (caller.backend, caller.method, caller.run_id, caller.run_attempt) == ("l2", "oidc", 77, 3)


def test_repository_claim_is_matched_case_insensitively(auth, oidc_issuer):  # noqa: F811
    assert auth.authenticate("Bearer " + oidc_issuer.mint("org/l4-ci", AUDIENCE)).backend == "l4"


def test_jwks_is_fetched_once_and_cached(auth, oidc_issuer):  # noqa: F811
    auth.verifier.jwks._min_refresh = 3600
    for _ in range(3):
        auth.authenticate("Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE))
    assert oidc_issuer.jwks_requests == 1


def test_expired(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, now=time.time() - 3600, lifetime=300)
    assert "expired" in refused(auth, f"Bearer {token}", 401, "token_expired")


def test_not_yet_valid(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, now=time.time() + 3600)
    refused(auth, f"Bearer {token}", 401, "token_not_yet_valid")


def test_wrong_audience(auth, oidc_issuer):  # noqa: F811
    message = refused(auth, "Bearer " + oidc_issuer.mint("org/l2-ci", "someone-else"), 401, "wrong_audience")
    assert AUDIENCE in message


def test_wrong_issuer(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, issuer="https://evil.example")
    refused(auth, f"Bearer {token}", 401, "wrong_issuer")


def test_unknown_key_id(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, kid="not-a-published-key", key=new_rsa_key())
    refused(auth, f"Bearer {token}", 401, "unknown_key_id")


def test_rotated_key_is_fetched_on_unknown_kid(auth, oidc_issuer):  # noqa: F811
    auth.authenticate("Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE))
    oidc_issuer.rotate()
    assert auth.authenticate("Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE)).backend == "l2"
    assert oidc_issuer.jwks_requests == 2


def test_unknown_kid_refetch_is_rate_limited(oidc_issuer):  # noqa: F811
    verifier = OidcVerifier(oidc_issuer.url, AUDIENCE, JwksCache(oidc_issuer.url, min_refresh_seconds=3600))
    verifier.verify(oidc_issuer.mint("org/l2-ci", AUDIENCE))
    for _ in range(5):
        with pytest.raises(AuthError):
            verifier.verify(oidc_issuer.mint("org/l2-ci", AUDIENCE, kid="forged", key=new_rsa_key()))
    assert oidc_issuer.jwks_requests == 1


def test_alg_none_refused(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, algorithm="none")
    assert "'none'" in refused(auth, f"Bearer {token}", 401, "algorithm_refused")


@pytest.mark.parametrize("alg", ["HS256", "HS512"])
def test_hmac_refused(auth, oidc_issuer, alg):  # noqa: F811
    refused(auth, "Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE, algorithm=alg), 401, "algorithm_refused")


def test_signature_by_another_key_with_a_published_kid(auth, oidc_issuer):  # noqa: F811
    token = oidc_issuer.mint("org/l2-ci", AUDIENCE, key=new_rsa_key())
    refused(auth, f"Bearer {token}", 401, "invalid_token")


def test_repository_not_allowlisted(auth, oidc_issuer):  # noqa: F811
    message = refused(auth, "Bearer " + oidc_issuer.mint("evil/fork", AUDIENCE), 403, "not_allowlisted")
    assert "evil/fork" in message


def test_l1_repository_refused(auth, oidc_issuer):  # noqa: F811
    message = refused(auth, "Bearer " + oidc_issuer.mint("org/l1-ci", AUDIENCE), 403, "level_too_low")
    assert "L1" in message and "L2" in message


def test_missing_repository_claim(auth, oidc_issuer):  # noqa: F811
    refused(auth, "Bearer " + oidc_issuer.mint("org/l2-ci", AUDIENCE, omit=("repository",)), 401, "missing_claim")


def test_garbage_and_missing_headers(auth):
    refused(auth, None, 401, "missing_credentials")
    refused(auth, "Bearer", 401, "missing_credentials")
    refused(auth, "Bearer not.a.jwt", 401, "malformed_token")
    refused(auth, "Basic dXNlcjpwYXNz", 401, "unknown_scheme")


def test_jwks_unreachable_is_a_clear_401():
    verifier = OidcVerifier("http://127.0.0.1:9", AUDIENCE, JwksCache("http://127.0.0.1:9", timeout=1))
    from relay.testing.oidc_issuer import FakeOidcIssuer

    issuer = FakeOidcIssuer()  # not started: only used to sign
    issuer._server = type("S", (), {"server_address": ("127.0.0.1", 9)})()
    with pytest.raises(AuthError) as info:
        verifier.verify(issuer.mint("org/l2-ci", AUDIENCE))
    assert info.value.code == "jwks_unavailable"


def test_static_token(auth):
    caller = auth.authenticate(f"Token {TOKENS['l2']}")
    assert (caller.backend, caller.method) == ("l2", "token")


def test_static_token_wrong_or_of_l1(auth):
    refused(auth, "Token wrong-token", 401, "bad_token")
    refused(auth, f"Token {TOKENS['l1']}", 403, "level_too_low")


def test_oidc_off_without_audience():
    auth = CallerAuth(TARGETS, None)
    refused(auth, "Bearer x.y.z", 401, "oidc_not_configured")
    assert auth.authenticate(f"Token {TOKENS['l2']}").backend == "l2"


def test_targets_load_token_digests_from_descriptors(results_backends):  # noqa: F811
    targets = {t.name: t for t in load_allowlist(results_backends)}
    assert targets["l3"].level is TrustLevel.L3
    assert targets["l3"].callback_token_sha256 == hashlib.sha256(TOKENS["l3"].encode()).hexdigest()
