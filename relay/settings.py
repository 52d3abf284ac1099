"""Relay configuration: environment variables ``RELAY_*``, optionally a YAML file, validated at start-up.

Triggered once by ``relay serve`` (or by a test building an app). Reads the process environment and,
when ``RELAY_CONFIG_FILE`` names one, a YAML mapping whose keys are the variable names without the
``RELAY_`` prefix, in lower case (``webhook_secrets: [a, b]``); environment variables win over the file.
Writes nothing. A missing or invalid setting raises :class:`SettingsError` whose message names the
environment variable and says how to fix it. Secrets are ``SecretStr``: printing or logging settings
shows ``**********``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = ["ENV_PREFIX", "Settings", "SettingsError", "load_settings"]

ENV_PREFIX = "RELAY_"
CONFIG_FILE_VAR = "RELAY_CONFIG_FILE"


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the variable and the fix."""


def _env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what the YAML error is, without the snippet of the file PyYAML quotes (it may hold a secret)."""
    def where(mark) -> str:
        return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"

    text = f"{getattr(exc, 'problem', None) or type(exc).__name__}{where(getattr(exc, 'problem_mark', None))}"
    context = getattr(exc, "context", None)
    if context:
        text = f"{context}{where(getattr(exc, 'context_mark', None))}: {text}"
    return text


class _YamlFileSource(PydanticBaseSettingsSource):
    """Values from the YAML file named by ``RELAY_CONFIG_FILE`` (lower priority than the environment)."""

    def __init__(self, settings_cls: type[BaseSettings], path: str | None):
        super().__init__(settings_cls)
        self._values: dict[str, Any] = {}
        if not path:
            return
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise SettingsError(f"{CONFIG_FILE_VAR}: cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise SettingsError(f"{CONFIG_FILE_VAR}: {path} is not valid YAML: {_yaml_problem(exc)}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise SettingsError(f"{CONFIG_FILE_VAR}: {path} must hold a YAML mapping of settings")
        unknown = sorted(set(data) - set(settings_cls.model_fields))
        if unknown:
            raise SettingsError(
                f"{CONFIG_FILE_VAR}: {path}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(settings_cls.model_fields))}"
            )
        self._values = data

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is what pydantic uses
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _split_secrets(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Every setting of the relay; the environment variable is ``RELAY_`` + the field name in capitals."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- intake
    webhook_secrets: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        description="comma-separated webhook secrets; every one is accepted (rotation)"
    )
    upstream_repo: str = Field("pytorch/pytorch", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")
    max_body_bytes: int = Field(25 * 1024 * 1024, gt=0, description="webhooks larger than this get 413")
    unauthenticated_body_budget_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="webhook bytes read at once before their signature is checked; beyond: 503",
    )
    body_read_timeout_seconds: float = Field(30.0, gt=0, description="a request body must arrive within this (408)")
    http_max_connections: int = Field(
        512, ge=1, description="relay serve: connections and requests at once (uvicorn limit_concurrency; beyond: 503)",
    )
    http_keep_alive_seconds: float = Field(5.0, gt=0, description="relay serve: idle keep-alive connections close after this")
    http_header_timeout_seconds: float = Field(
        10.0, gt=0, description="relay serve: a connection whose request headers take longer is closed",
    )
    backends_dir: Path | None = Field(None, description="folder of backend descriptors (the allowlist)")

    # --- GitHub
    github_api_url: str = "https://api.github.com"
    github_token: SecretStr | None = None
    github_app_id: str | None = None
    github_private_key_file: Path | None = None
    github_timeout_seconds: float = Field(10.0, gt=0)
    github_content_requests_per_minute: float = Field(
        80.0, ge=0, description="pace of content-creating calls per credential; 0 = unpaced"
    )
    github_secondary_backoff_seconds: float = Field(60.0, gt=0)

    # --- store
    database_url: str = "sqlite:///relay.db"
    store_deadline_seconds: float = Field(
        5.0, gt=0, lt=10, description="longest a webhook or /readyz waits on the store before answering 503 "
        "(GitHub gives up after 10 s); also bounds each statement, lock wait and connection attempt"
    )

    replay_window_hours: float = Field(
        7 * 24.0, gt=0, description="a signed webhook body stored again under a fresh delivery id within this many "
        "hours is a duplicate (200); later it is a new delivery; GitHub's redeliveries keep their id and stay duplicates"
    )

    # --- dispatch
    dispatcher_enabled: bool = True
    dispatch_concurrency: int = Field(64, ge=1, le=512)
    dispatch_poll_seconds: float = Field(1.0, gt=0)
    dispatch_lease_seconds: float = Field(60.0, gt=0)
    dispatch_max_attempts: int = Field(8, ge=1)
    dispatch_backoff_base_seconds: float = Field(5.0, gt=0)
    dispatch_backoff_max_seconds: float = Field(900.0, gt=0)
    dispatch_credential_pause_seconds: float = Field(
        60.0, gt=0, description="after GitHub refuses a credential (401), no process calls with it for this long; "
        "then one call tries it again (the rows wait in the queue, their attempts untouched)"
    )

    # --- results: callbacks, reporting, re-runs, sweeper, level review, dashboard
    oidc_issuer: str = Field("https://token.actions.githubusercontent.com", description="OIDC issuer of callback tokens")
    oidc_audience: str | None = Field(None, description="audience callback OIDC tokens must carry; unset: OIDC off")
    oidc_jwks_url: str | None = Field(None, description="JWKS URL; default from the issuer's openid-configuration")
    oidc_max_token_lifetime_seconds: float = Field(
        3600.0, gt=0, description="OIDC tokens valid longer than this (exp - iat) are refused",
    )
    callback_max_bytes: int = Field(8 * 1024 * 1024, gt=0, description="callbacks larger than this get 413")
    callback_max_tests: int = Field(20_000, gt=0, description="reports with more tests than this get 413")
    callback_max_message_chars: int = Field(
        16_384, gt=0, description="a report whose test message is longer than this gets 413 (4000 are stored)",
    )
    callback_rate_per_minute: float = Field(120.0, ge=0, description="callbacks per repository per minute; 0 = off")
    callback_rate_burst: int = Field(60, ge=1)
    dashboard_url: str = Field("http://127.0.0.1:8000", description="public base URL of the dashboard (details links)")
    reporting_enabled: bool = True
    reporting_poll_seconds: float = Field(5.0, gt=0, description="how often reporting looks for runs and labels changed by other processes")
    sweeper_enabled: bool = True
    sweep_interval_seconds: float = Field(60.0, gt=0)
    run_start_timeout_seconds: float = Field(6 * 3600.0, gt=0, description="dispatched but never started -> timed_out")
    run_timeout_seconds: float = Field(3 * 86400.0, gt=0, description="in progress longer than this -> timed_out")
    nonce_ttl_hours: float = Field(7 * 24.0, gt=0, description="callbacks quoting an older dispatch's nonce get 410")
    rerun_poll_seconds: float = Field(2.0, gt=0)
    level_l2_success_rate: float = Field(0.70, ge=0, le=1)
    level_l3_success_rate: float = Field(0.90, ge=0, le=1)
    level_max_time_to_result_seconds: float = Field(3 * 3600.0, gt=0)
    level_min_runs: int = Field(5, ge=1)
    level_watch_enabled: bool = Field(True, description="hold backends found below their level's bar (relay.levels.watch)")
    level_watch_seconds: float = Field(300.0, gt=0, description="how often the level watch reviews every backend")
    level_hold_recovery_hours: float = Field(
        24.0, ge=0, description="a held backend back above its bar for this long is no longer held (L4: blocks again)",
    )
    descriptor_check_seconds: float = Field(
        30.0, ge=0, description="how often relay serve checks the descriptor files for changes (0: only on SIGHUP)",
    )

    # --- level-change and quarantine-release proposals (pull requests on the descriptor repository)
    proposals_repository: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$",
        description="owner/name of the repository holding the backend descriptors; unset: nothing is proposed",
    )
    proposals_base_branch: str = Field("main", min_length=1, description="branch the proposals are made against")
    proposals_descriptor_path: str = Field(
        "backends/{name}.yaml", description="path of a backend's descriptor in that repository ({name}: the backend)",
    )
    proposals_descriptor_paths: dict[str, str] = Field(
        default_factory=dict, description="per-backend paths that differ from the pattern, as JSON: {\"cuda\": \"ci/cuda.yaml\"}",
    )
    proposals_demote_after_seconds: float = Field(
        3 * 86400.0, gt=0, description="a demotion is proposed once the backend's level hold has had it below its bar this long",
    )
    proposals_interval_seconds: float = Field(3600.0, gt=0, description="how often the proposals pass runs")
    proposals_max_per_pass: int = Field(20, ge=1, description="proposals opened, updated or closed per pass at most")

    # --- observability
    metrics_token: SecretStr | None = Field(
        None, description="if set, GET /metrics needs 'Authorization: Bearer <token>'; unset: /metrics is open",
    )

    # --- logs
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, _YamlFileSource(settings_cls, os.environ.get(CONFIG_FILE_VAR)))

    @field_validator("webhook_secrets", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _split_secrets(value)

    @field_validator("webhook_secrets")
    @classmethod
    def _non_empty(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        if not value:
            raise ValueError("at least one secret is required")
        return value

    @field_validator("github_api_url", "oidc_issuer", "dashboard_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @field_validator("proposals_descriptor_path")
    @classmethod
    def _names_the_backend(cls, value: str) -> str:
        if "{name}" not in value or value.startswith("/"):
            raise ValueError(f"{value!r} must be a path inside the repository containing {{name}}, e.g. backends/{{name}}.yaml")
        return value

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        scheme = value.split(":", 1)[0].split("+", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgres"):
            raise ValueError(f"{value.split(':', 1)[0]!r} databases are not supported; use sqlite:/// or postgresql://")
        return value

    @field_validator("backends_dir")
    @classmethod
    def _is_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{value} is not a directory of backend *.yaml files")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        app = self.github_app_id is not None or self.github_private_key_file is not None
        if self.github_token is not None and app:
            raise ValueError(
                "RELAY_GITHUB_TOKEN and RELAY_GITHUB_APP_ID/RELAY_GITHUB_PRIVATE_KEY_FILE are both set; "
                "choose one way to authenticate"
            )
        if app:
            if not self.github_app_id or not self.github_private_key_file:
                raise ValueError("GitHub App auth needs both RELAY_GITHUB_APP_ID and RELAY_GITHUB_PRIVATE_KEY_FILE")
            if not self.github_app_id.isdigit():
                raise ValueError(f"RELAY_GITHUB_APP_ID must be the numeric app id, got {self.github_app_id!r}")
            try:
                pem = self.github_private_key_file.read_text()
            except OSError as exc:
                raise ValueError(
                    f"RELAY_GITHUB_PRIVATE_KEY_FILE: cannot read {self.github_private_key_file}: {exc.strerror}"
                ) from None
            if "PRIVATE KEY" not in pem:
                raise ValueError(
                    f"RELAY_GITHUB_PRIVATE_KEY_FILE: {self.github_private_key_file} is not a PEM private key "
                    "(download it from the GitHub App's settings page)"
                )
        elif self.github_token is None:
            raise ValueError(
                "no GitHub credentials: set RELAY_GITHUB_TOKEN, or RELAY_GITHUB_APP_ID and "
                "RELAY_GITHUB_PRIVATE_KEY_FILE for a GitHub App"
            )
        if self.dispatch_lease_seconds <= 2 * self.github_timeout_seconds:
            raise ValueError(
                "RELAY_DISPATCH_LEASE_SECONDS must exceed twice RELAY_GITHUB_TIMEOUT_SECONDS, so that a "
                "claim cannot expire while its request is still running"
            )
        return self

    @property
    def uses_github_app(self) -> bool:
        return self.github_app_id is not None

    def secret_values(self) -> list[bytes]:
        return [s.get_secret_value().encode() for s in self.webhook_secrets]


def load_settings(**overrides: Any) -> Settings:
    """load_settings(**overrides) -> Settings: environment (+ YAML file), overrides win.

    Raises SettingsError naming each bad or missing setting by its environment variable.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            name = _env_name(field) if field else "settings"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                msg = "required but not set"
            lines.append(f"  {name}: {msg}")
        raise SettingsError("invalid relay settings:\n" + "\n".join(lines)) from None
