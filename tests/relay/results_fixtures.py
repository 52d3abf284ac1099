"""Fixtures of the results-side tests (imported by those test modules; the shared ones stay in conftest):
a fake OIDC issuer, backends with callback tokens, and a served relay with OIDC, reporting and fast polls."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.relay.helpers import UPSTREAM, RelayUnderTest
from tests.relay.results_support import AUDIENCE, REPOS, Driver, write_backends


@pytest.fixture
def oidc_issuer():
    from relay.testing.oidc_issuer import FakeOidcIssuer

    with FakeOidcIssuer() as issuer:
        yield issuer


@pytest.fixture
def results_backends(tmp_path: Path) -> Path:
    return write_backends(tmp_path / "results-backends")


@pytest.fixture
def results_relay(fake_github, oidc_issuer, results_backends):
    """results_relay(database_url, **settings) -> (RelayUnderTest, Driver); the sweeper is off (tests sweep by hand).
    The polls are half a second, as in ``helpers.FAST``: what this relay changes wakes reporting itself."""
    started: list[RelayUnderTest] = []

    def start(database_url: str, **overrides):
        values = dict(
            oidc_issuer=oidc_issuer.url, oidc_audience=AUDIENCE, sweeper_enabled=False, reporting_poll_seconds=0.5,
            rerun_poll_seconds=0.5, dashboard_url="http://dashboard.test",
        )
        values.update(overrides)
        relay = RelayUnderTest.start(database_url, fake_github, results_backends, **values)
        started.append(relay)
        return relay, Driver(relay)

    yield start
    for relay in started:
        relay.stop()


@functools.cache
def _app_key_pems() -> tuple[bytes, bytes]:
    """One App key for this process's tests (private PEM, public PEM): each test's fake GitHub is its own, so
    none sees another's App. A new key per test cost its generation and the relay's check of it
    (``relay.github._app_key`` keeps a key it has checked, by its PEM), about 0.1 s of CPU each."""
    from relay.testing.oidc_issuer import new_rsa_key

    key = new_rsa_key()
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


@pytest.fixture
def app_mode(fake_github, tmp_path: Path):
    """GitHub App credentials the fake accepts, installed on upstream and every downstream repository."""
    private_pem, public_pem = _app_key_pems()
    pem = tmp_path / "app.pem"
    pem.write_bytes(private_pem)
    fake_github.app_id = "4242"
    fake_github.app_public_key_pem = public_pem
    for repo in (UPSTREAM, *REPOS.values()):
        fake_github.install_app(repo)
    return dict(github_token=None, github_app_id="4242", github_private_key_file=str(pem))
