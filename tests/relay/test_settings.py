"""Settings: environment, YAML file, refusals naming the variable, secrets never shown; the relay CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relay.settings import SettingsError, load_settings

BASE = {"RELAY_WEBHOOK_SECRETS": "s1, s2", "RELAY_GITHUB_TOKEN": "ghp_supersecret"}


@pytest.fixture
def env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("RELAY_"):
            monkeypatch.delenv(key)

    def set_env(**values):
        for key, value in values.items():
            monkeypatch.setenv(key, value)

    return set_env


def test_defaults_and_secret_list(env):
    env(**BASE)
    settings = load_settings()
    assert [s.get_secret_value() for s in settings.webhook_secrets] == ["s1", "s2"]
    assert settings.upstream_repo == "pytorch/pytorch"
    assert settings.github_api_url == "https://api.github.com"
    assert settings.database_url == "sqlite:///relay.db"
    assert "ghp_supersecret" not in repr(settings) and "s1" not in str(settings.webhook_secrets)


def test_missing_secrets_name_the_variable(env):
    env(RELAY_GITHUB_TOKEN="x")
    with pytest.raises(SettingsError, match="RELAY_WEBHOOK_SECRETS: required but not set"):
        load_settings()
    env(RELAY_WEBHOOK_SECRETS=" , ")
    with pytest.raises(SettingsError, match="RELAY_WEBHOOK_SECRETS: at least one secret is required"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("RELAY_UPSTREAM_REPO", "not a repo", "RELAY_UPSTREAM_REPO"),
        ("RELAY_GITHUB_API_URL", "ftp://x", "RELAY_GITHUB_API_URL: 'ftp://x' is not an http(s) URL"),
        ("RELAY_DATABASE_URL", "mysql://x/y", "RELAY_DATABASE_URL: 'mysql' databases are not supported"),
        ("RELAY_BACKENDS_DIR", "/no/such/dir", "RELAY_BACKENDS_DIR: /no/such/dir is not a directory"),
        ("RELAY_MAX_BODY_BYTES", "-1", "RELAY_MAX_BODY_BYTES"),
        ("RELAY_DISPATCH_CONCURRENCY", "lots", "RELAY_DISPATCH_CONCURRENCY"),
        ("RELAY_GITHUB_APP_ID", "12", "RELAY_GITHUB_TOKEN and RELAY_GITHUB_APP_ID"),
    ],
)
def test_invalid_values_name_the_variable(env, variable, value, words):
    env(**BASE, **{variable: value})
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert words in str(caught.value)
    assert "ghp_supersecret" not in str(caught.value) and "s1" not in str(caught.value).replace("RELAY", "")


def test_github_credentials_are_required(env, tmp_path):
    env(RELAY_WEBHOOK_SECRETS="s")
    with pytest.raises(SettingsError, match="no GitHub credentials: set RELAY_GITHUB_TOKEN"):
        load_settings()
    env(RELAY_GITHUB_APP_ID="12")
    with pytest.raises(SettingsError, match="needs both RELAY_GITHUB_APP_ID and RELAY_GITHUB_PRIVATE_KEY_FILE"):
        load_settings()
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    env(RELAY_GITHUB_PRIVATE_KEY_FILE=str(key))
    with pytest.raises(SettingsError, match="is not a PEM private key"):
        load_settings()
    key.write_text("-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----\n")
    assert load_settings().uses_github_app


def test_yaml_file_with_environment_winning(env, tmp_path):
    config = tmp_path / "relay.yaml"
    config.write_text("webhook_secrets: [from-file]\ngithub_token: t\nupstream_repo: org/up\nmax_body_bytes: 1000\n")
    env(RELAY_CONFIG_FILE=str(config), RELAY_MAX_BODY_BYTES="2000")
    settings = load_settings()
    assert [s.get_secret_value() for s in settings.webhook_secrets] == ["from-file"]
    assert settings.upstream_repo == "org/up" and settings.max_body_bytes == 2000


def test_yaml_file_errors(env, tmp_path):
    config = tmp_path / "relay.yaml"
    config.write_text("webhook_secret: typo\n")
    env(RELAY_CONFIG_FILE=str(config))
    with pytest.raises(SettingsError, match="unknown setting.*webhook_secret"):
        load_settings()
    env(RELAY_CONFIG_FILE=str(tmp_path / "missing.yaml"))
    with pytest.raises(SettingsError, match="RELAY_CONFIG_FILE: cannot read"):
        load_settings()


def test_lease_must_outlast_a_request(env):
    env(**BASE, RELAY_DISPATCH_LEASE_SECONDS="15", RELAY_GITHUB_TIMEOUT_SECONDS="10")
    with pytest.raises(SettingsError, match="RELAY_DISPATCH_LEASE_SECONDS must exceed twice"):
        load_settings()


def _relay_cli(*args, env_extra=None, timeout=60):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    environment.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "relay.cli", *args], capture_output=True, text=True,
                          env=environment, timeout=timeout)


def test_cli_refuses_to_start_naming_the_setting():
    result = _relay_cli("serve", "--port", "0", env_extra={"RELAY_GITHUB_TOKEN": "ghp_topsecret"})
    assert result.returncode == 2
    assert "RELAY_WEBHOOK_SECRETS: required but not set" in result.stderr
    assert "ghp_topsecret" not in result.stderr + result.stdout


def test_cli_refuses_an_unreachable_database(tmp_path):
    result = _relay_cli("serve", "--port", "0", env_extra={
        **BASE, "RELAY_DATABASE_URL": "postgresql://nobody:pw@127.0.0.1:1/none", "RELAY_BACKENDS_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "RELAY_DATABASE_URL" in result.stderr and "pw@" not in result.stderr


def test_cli_help_lists_subcommands():
    result = _relay_cli("--help")
    assert result.returncode == 0 and "serve" in result.stdout


def test_yaml_syntax_error_names_the_line_but_never_echoes_its_text(env, tmp_path):
    config = tmp_path / "relay.yaml"
    config.write_text("github_token: t\nwebhook_secrets: [hunter2-very-secret\nupstream_repo: org/up: x\n")
    env(RELAY_CONFIG_FILE=str(config))
    with pytest.raises(SettingsError) as raised:
        load_settings()
    message = str(raised.value)
    assert "is not valid YAML" in message and "line 2" in message and "column" in message
    assert "hunter2" not in message and "org/up" not in message
