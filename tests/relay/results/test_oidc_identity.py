"""OIDC callbacks bind the repository's numeric identity, not just its name: ids recorded in the backend's
relay section, or pinned at the first authenticated callback; a bounded token lifetime; an optional
workflow ref. Over real HTTP against a served relay and a real JWKS endpoint on loopback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.relay.results_fixtures import oidc_issuer, results_relay  # noqa: F401
from tests.relay.results_support import AUDIENCE, REPOS, write_backends
from tests.relay.results.test_receiver import error_of

WORKFLOW = "org/l3-ci/.github/workflows/crcr.yml@refs/heads/main"


@pytest.fixture
def results_backends(tmp_path: Path) -> Path:
    folder = write_backends(tmp_path / "identity-backends")
    for name, extra in (("l2", "repository_id: 111, repository_owner_id: 222"), ("l3", f"workflow_ref: '{WORKFLOW}'")):
        path = folder / f"{name}.yaml"
        path.write_text(path.read_text().replace(f"relay: {{repository: {REPOS[name]},",
                                                 f"relay: {{repository: {REPOS[name]}, {extra},"))
    return folder


@pytest.fixture
def relay_and_driver(results_relay, sqlite_url):  # noqa: F811
    return results_relay(sqlite_url)


def _start(drive, issuer, backend: str, run_id: int, **claims):
    nonce = drive.nonce(backend, drive.open_pr(60 + run_id % 100))
    token = issuer.mint(REPOS[backend], AUDIENCE, run_id=run_id, **claims)
    return drive.start(backend, nonce, run_id=run_id, auth=f"Bearer {token}")


def test_recorded_repository_ids_must_match(relay_and_driver, oidc_issuer):  # noqa: F811
    relay, drive = relay_and_driver
    ok = _start(drive, oidc_issuer, "l2", 1, repository_id="111", repository_owner_id="222")
    assert ok.status_code == 200, ok.text
    # The same name under another repository (deleted and re-created, or a renamed owner) is refused.
    detail = error_of(_start(drive, oidc_issuer, "l2", 2, repository_id="999", repository_owner_id="222"),
                      403, "repository_identity_mismatch")
    assert "repository_id 999" in detail and "111" in detail
    error_of(_start(drive, oidc_issuer, "l2", 3, repository_id="111", repository_owner_id="7"), 403,
             "repository_identity_mismatch")
    error_of(_start(drive, oidc_issuer, "l2", 4, omit=("repository_id",)), 401, "missing_claim")


def test_ids_are_pinned_at_the_first_callback_when_not_recorded(relay_and_driver, oidc_issuer):  # noqa: F811
    relay, drive = relay_and_driver
    assert _start(drive, oidc_issuer, "l4", 11, repository_id="333", repository_owner_id="444").status_code == 200
    assert relay.store.oidc_identity("l4") == (333, 444)
    detail = error_of(_start(drive, oidc_issuer, "l4", 12, repository_id="335", repository_owner_id="444"),
                      403, "repository_identity_mismatch")
    assert "pinned" in detail
    assert _start(drive, oidc_issuer, "l4", 13, repository_id="333", repository_owner_id="444").status_code == 200


def test_token_lifetime_is_bounded(relay_and_driver, oidc_issuer):  # noqa: F811
    relay, drive = relay_and_driver
    detail = error_of(_start(drive, oidc_issuer, "l4", 21, lifetime=7 * 86400), 401, "token_lifetime_too_long")
    assert "3600" in detail
    assert _start(drive, oidc_issuer, "l4", 22, lifetime=600, now=time.time()).status_code == 200


def test_optional_workflow_ref(relay_and_driver, oidc_issuer):  # noqa: F811
    relay, drive = relay_and_driver
    detail = error_of(_start(drive, oidc_issuer, "l3", 31, workflow_ref="org/l3-ci/.github/workflows/evil.yml@refs/heads/x"),
                      403, "workflow_mismatch")
    assert WORKFLOW in detail
    assert _start(drive, oidc_issuer, "l3", 32, workflow_ref=WORKFLOW).status_code == 200
