"""The fake OIDC issuer hands the keys of stopped issuers to later ones, never to two live ones."""

from __future__ import annotations

import jwt

from relay.testing.oidc_issuer import FakeOidcIssuer, new_rsa_key


def public_numbers(issuer: FakeOidcIssuer) -> set:
    return {key.public_key().public_numbers() for key in issuer.keys.values()}


def test_live_issuers_never_share_a_key_and_a_stopped_ones_keys_go_to_the_next():
    with FakeOidcIssuer() as first, FakeOidcIssuer() as second:
        first.rotate()
        forged = new_rsa_key().public_key().public_numbers()
        assert len(public_numbers(first)) == 2 and not public_numbers(first) & public_numbers(second)
        assert forged not in public_numbers(first) | public_numbers(second)
        given_back = public_numbers(first) | public_numbers(second)
    assert first.keys == {} and second.keys == {}  # stopped: no longer theirs
    with FakeOidcIssuer() as third:
        assert public_numbers(third) and public_numbers(third) <= given_back  # the last given back, not a new one
        assert forged not in public_numbers(third)  # a key forged by a test never goes back


def test_an_issuer_started_again_signs_with_a_key_it_serves():
    issuer = FakeOidcIssuer().start()
    issuer.stop()
    with FakeOidcIssuer() as other:
        issuer.start()
        try:
            assert not public_numbers(issuer) & public_numbers(other)
            token = issuer.mint("org/repo", "aud")
            [jwk] = [k for k in issuer.jwks()["keys"] if k["kid"] == jwt.get_unverified_header(token)["kid"]]
            key = jwt.algorithms.RSAAlgorithm.from_jwk(jwk)
            assert jwt.decode(token, key, algorithms=["RS256"], audience="aud")["repository"] == "org/repo"
        finally:
            issuer.stop()
