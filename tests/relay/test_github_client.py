"""relay.github against the fake GitHub over real HTTP: typed calls, failure sorting, GitHub App tokens."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from relay.github import GitHubClient, PermanentError, RateLimitedError, RetryableError
from relay.testing import FakeGitHub, Fault
from relay.testing import loopback_client


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


@pytest.fixture
def client(fake_github):
    return GitHubClient(fake_github.url, token="test-token", timeout=2, secondary_backoff_seconds=60)


def test_repository_dispatch_is_a_204_post(client, fake_github):
    result = client.repository_dispatch("org/ci", "push", {"delivery": "d"})
    assert result.status == 204 and result.credential == "token" and result.pause_seconds is None
    [request] = fake_github.requests
    assert (request.method, request.path) == ("POST", "/repos/org/ci/dispatches")
    assert request.headers["authorization"] == "token test-token"
    assert request.json == {"event_type": "push", "client_payload": {"delivery": "d"}}


def test_payload_over_limits_is_permanent(client):
    with pytest.raises(PermanentError) as caught:
        client.repository_dispatch("org/ci", "push", {f"k{i}": i for i in range(11)})
    assert caught.value.status == 422 and "No more than 10 properties" in caught.value.message


@pytest.mark.parametrize(
    ("fault", "kind", "status"),
    [
        (Fault.server_error(500), RetryableError, 500),
        (Fault.server_error(504), RetryableError, 504),
        (Fault.dropped(), RetryableError, None),
        (Fault.rate_limited(retry_after=7), RateLimitedError, 429),
        (Fault.secondary_limit(), RateLimitedError, 403),
        (Fault.primary_exhausted(reset_in=30), RateLimitedError, 403),
        (Fault.unprocessable(), PermanentError, 422),
        (Fault.not_found(), PermanentError, 404),
        (Fault.bad_credentials(), PermanentError, 401),
        (Fault(status=403, body={"message": "Resource not accessible by integration"}), PermanentError, 403),
    ],
    ids=["500", "504", "dropped", "429", "403-secondary", "403-primary", "422", "404", "401", "403-forbidden"],
)
def test_every_failure_is_sorted(client, fake_github, fault, kind, status):
    fake_github.script(fault)
    with pytest.raises(kind) as caught:
        client.repository_dispatch("org/ci", "push", {})
    assert type(caught.value) is kind and caught.value.status == status
    assert "org/ci" in caught.value.message


def test_rate_limit_waits(client, fake_github):
    fake_github.script(Fault.rate_limited(retry_after=7))
    with pytest.raises(RateLimitedError) as caught:
        client.repository_dispatch("org/ci", "push", {})
    assert caught.value.wait_seconds == 7
    fake_github.script(Fault.primary_exhausted(reset_in=30))
    with pytest.raises(RateLimitedError) as caught:
        client.repository_dispatch("org/ci", "push", {})
    assert 25 <= caught.value.wait_seconds <= 32
    # secondary without retry-after: one minute, then doubling, reset by a success
    fake_github.script(Fault.secondary_limit(), Fault.secondary_limit())
    waits = []
    for _ in range(2):
        with pytest.raises(RateLimitedError) as caught:
            client.repository_dispatch("org/ci", "push", {})
        waits.append(caught.value.wait_seconds)
    assert waits == [60, 120]
    client.repository_dispatch("org/ci", "push", {})
    fake_github.script(Fault.secondary_limit())
    with pytest.raises(RateLimitedError) as caught:
        client.repository_dispatch("org/ci", "push", {})
    assert caught.value.wait_seconds == 60


def test_success_with_exhausted_primary_limit_asks_for_a_pause(client, fake_github):
    reset = int(time.time()) + 20
    fake_github.script(Fault(headers=(("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", str(reset)))))
    result = client.repository_dispatch("org/ci", "push", {})
    assert result.status == 204 and 15 < result.pause_seconds <= 21


def test_commit_status(client, fake_github):
    result = client.create_status("org/ci", "a" * 40, "success", context="conformance/cpu", description="d" * 200,
                                  target_url="https://example.com/run/1")
    assert result.status == 201 and result.data["state"] == "success"
    assert fake_github.statuses[0]["description"] == "d" * 140
    with pytest.raises(ValueError, match="pending, success, error or failure"):
        client.create_status("org/ci", "a" * 40, "passed", context="x")


def test_check_runs_need_a_github_app(client):
    with pytest.raises(PermanentError) as caught:
        client.create_check_run("org/ci", name="conformance", head_sha="a" * 40)
    assert caught.value.status == 403 and "GitHub App" in caught.value.message


def test_github_app_installation_tokens_and_check_runs(app_key):
    private, public = app_key
    with FakeGitHub(app_id=42, app_public_key_pem=public) as fake:
        installation = fake.install_app("pytorch/pytorch")
        client = GitHubClient(fake.url, app_id=42, private_key_pem=private, timeout=2)  # an int id works too
        created = client.create_check_run("pytorch/pytorch", name="conformance / cpu", head_sha="a" * 40,
                                          status="in_progress", external_id="run-1")
        assert created.status == 201 and created.credential == f"installation:{installation}"
        assert created.data["url"].startswith(fake.url)  # absolute URLs pointing at the fake
        updated = client.update_check_run("pytorch/pytorch", created.data["id"], status="completed",
                                          conclusion="success", output={"title": "ok", "summary": "all passed"})
        assert updated.data["conclusion"] == "success"
        assert fake.check_runs[created.data["id"]]["output"]["summary"] == "all passed"
        token = client.installation_token("pytorch/pytorch")
        assert token.installation_id == installation and token.token.startswith("ghs_")
        assert "ghs_" not in repr(token)
        # One token fetch served all three calls.
        assert sum(r.endpoint == "access_tokens" for r in fake.requests) == 1
        assert client.credential_for("pytorch/pytorch") == f"installation:{installation}"


def test_installation_token_is_refreshed_before_it_expires(app_key):
    private, public = app_key
    with FakeGitHub(app_id="42", app_public_key_pem=public, token_lifetime_seconds=3) as fake:
        fake.install_app("org/ci")
        client = GitHubClient(fake.url, app_id="42", private_key_pem=private, token_refresh_margin_seconds=2)
        first = client.installation_token("org/ci")
        assert client.installation_token("org/ci").token == first.token
        time.sleep(1.1)  # now within the refresh margin
        second = client.installation_token("org/ci")
        assert second.token != first.token
        client.repository_dispatch("org/ci", "push", {})
        assert fake.requests[-1].headers["authorization"] == f"token {second.token}"


def test_app_not_installed_is_permanent(app_key):
    private, public = app_key
    with FakeGitHub(app_id="42", app_public_key_pem=public) as fake:
        client = GitHubClient(fake.url, app_id="42", private_key_pem=private)
        with pytest.raises(PermanentError) as caught:
            client.repository_dispatch("org/nowhere", "push", {})
        assert caught.value.status == 404 and "org/nowhere" in caught.value.message


def test_wrong_app_key_is_permanent(app_key):
    _, public = app_key
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    with FakeGitHub(app_id="42", app_public_key_pem=public) as fake:
        fake.install_app("org/ci")
        client = GitHubClient(fake.url, app_id="42", private_key_pem=other)
        with pytest.raises(PermanentError) as caught:
            client.repository_dispatch("org/ci", "push", {})
        assert caught.value.status == 401


def test_an_app_key_that_cannot_sign_is_refused_at_construction_naming_the_fix(tmp_path):
    """The key is parsed once, when the client is made: a broken one fails the relay's start, not its
    first dispatch, and the message says what to use instead (and echoes no key material)."""
    truncated = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    with pytest.raises(ValueError, match="not an unencrypted PEM private key") as caught:
        GitHubClient("http://127.0.0.1:9", app_id="42", private_key_pem=truncated)
    assert "App's settings page" in str(caught.value) and "MIIEvQ" not in str(caught.value)
    elliptic = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ValueError, match="is not an RSA key, and GitHub signs App JWTs with RS256"):
        GitHubClient("http://127.0.0.1:9", app_id="42", private_key_pem=elliptic)

    from relay.settings import load_settings

    key = tmp_path / "app.pem"
    key.write_text(truncated)
    settings = load_settings(webhook_secrets="s", github_app_id="42", github_private_key_file=str(key))
    with pytest.raises(ValueError, match=f"RELAY_GITHUB_PRIVATE_KEY_FILE \\({key}\\): the GitHub App private key is not"):
        GitHubClient.from_settings(settings)


def test_rerun_endpoints_are_recorded(fake_github):

    headers = {"Authorization": "token test-token"}
    assert loopback_client().post(f"{fake_github.url}/repos/org/ci/actions/runs/5/rerun", headers=headers).status_code == 201
    assert loopback_client().get(f"{fake_github.url}/repos/org/ci", headers=headers).json()["url"] == f"{fake_github.url}/repos/org/ci"
    assert [r.endpoint for r in fake_github.requests] == ["workflow_rerun", "repository"]
