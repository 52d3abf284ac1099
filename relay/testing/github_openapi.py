"""Request bodies checked against GitHub's own REST API description, so the fake GitHub cannot drift.

Used by :class:`relay.testing.FakeGitHub` for every request it serves. The description is the one
GitHub publishes (npm ``@octokit/openapi``, ``generated/api.github.com.deref.json``, ~70 MB): found
through ``$GITHUB_OPENAPI_DESCRIPTION``, else under ``.octokit/node_modules`` of this checkout (where
``.ci/run`` installs it). The operations the fake serves are cut out of it once and kept next to it
(``.fake-github-operations-v4.json``), so a test process reads a few kilobytes, not the whole file.

OpenAPI 3.0 schemas are JSON Schema draft 4 plus ``nullable``: a nullable type also admits ``null``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["DESCRIPTION_ENV", "GitHubOpenApi", "default_description"]

DESCRIPTION_ENV = "GITHUB_OPENAPI_DESCRIPTION"
_RELATIVE = Path(".octokit/node_modules/@octokit/openapi/generated/api.github.com.deref.json")
# The operations FakeGitHub implements that take a body (method, path template in the description).
OPERATIONS = (
    ("post", "/repos/{owner}/{repo}/dispatches"),
    ("post", "/repos/{owner}/{repo}/statuses/{sha}"),
    ("post", "/repos/{owner}/{repo}/check-runs"),
    ("patch", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
    ("post", "/repos/{owner}/{repo}/check-runs/{check_run_id}/rerequest"),
    ("post", "/repos/{owner}/{repo}/actions/runs/{run_id}/rerun"),
    ("post", "/app/installations/{installation_id}/access_tokens"),
    ("post", "/repos/{owner}/{repo}/git/refs"),
    ("patch", "/repos/{owner}/{repo}/git/refs/{ref}"),
    ("put", "/repos/{owner}/{repo}/contents/{path}"),
    ("post", "/repos/{owner}/{repo}/pulls"),
    ("patch", "/repos/{owner}/{repo}/pulls/{pull_number}"),
)
# Answers of the fake checked against GitHub's response schemas (method, path, status). The pull
# request endpoints are left out: GitHub's pull request object has 42 required fields, most of them
# nested users and repositories the fake does not model.
RESPONSES = (
    ("get", "/repos/{owner}/{repo}/contents/{path}", "200"),
    ("put", "/repos/{owner}/{repo}/contents/{path}", "200"),
    ("put", "/repos/{owner}/{repo}/contents/{path}", "201"),
    ("get", "/repos/{owner}/{repo}/git/ref/{ref}", "200"),
    ("post", "/repos/{owner}/{repo}/git/refs", "201"),
    ("patch", "/repos/{owner}/{repo}/git/refs/{ref}", "200"),
)
# Parameters that span path segments (a file path, heads/<branch with slashes>).
_MULTI_SEGMENT = ("{path}", "{ref}")


def default_description() -> Path | None:
    """Where GitHub's description is on this machine, or None."""
    configured = os.environ.get(DESCRIPTION_ENV)
    if configured:
        return Path(configured)
    candidate = Path(__file__).resolve().parents[2] / _RELATIVE
    return candidate if candidate.is_file() else None


def _nullable_to_json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable_to_json_schema(value) for key, value in node.items() if key not in ("example", "examples")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    return out


def _extract(description: Path) -> dict[str, Any]:
    spec = json.loads(description.read_bytes())
    operations = {}
    for method, template in OPERATIONS:
        operation = spec["paths"].get(template, {}).get(method)
        if operation is None:
            raise KeyError(f"{method.upper()} {template} is not in {description}: is it GitHub's REST description?")
        request_body = operation.get("requestBody") or {}
        schema = request_body.get("content", {}).get("application/json", {}).get("schema")
        operations[f"{method.upper()} {template}"] = {
            "schema": _nullable_to_json_schema(schema) if schema else None,
            "required": bool(request_body.get("required")),
        }
    responses = {}
    for method, template, status in RESPONSES:
        answer = spec["paths"][template][method]["responses"][status]
        responses[f"{method.upper()} {template} {status}"] = _nullable_to_json_schema(
            answer["content"]["application/json"]["schema"])
    return {"source": str(description), "size": description.stat().st_size, "operations": operations,
            "responses": responses}


@functools.lru_cache(maxsize=4)
def _operations(description: str) -> dict[str, Any]:
    """{"operations": request schemas by "METHOD template", "responses": by "METHOD template status"}."""
    path = Path(description)
    cache = path.with_name(".fake-github-operations-v4.json")
    try:
        cached = json.loads(cache.read_text())
        if (cached.get("size") == path.stat().st_size
                and set(cached["operations"]) == {f"{m.upper()} {t}" for m, t in OPERATIONS}
                and set(cached["responses"]) == {f"{m.upper()} {t} {c}" for m, t, c in RESPONSES}):
            return cached
    except (OSError, ValueError, KeyError):
        pass
    extracted = _extract(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fake-github-operations.", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(extracted, out)
    os.replace(tmp, cache)
    return extracted


def _pattern(template: str) -> re.Pattern[str]:
    expression = re.escape(template)
    for parameter in _MULTI_SEGMENT:
        expression = expression.replace(re.escape(parameter), ".+")
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", expression) + "$")


def _messages(validator, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<body>'}: {e.message}"
            for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))]


class GitHubOpenApi:
    """GitHubOpenApi(path to the deref description): ``problems(method, path, body)`` lists what GitHub would refuse."""

    def __init__(self, description: Path):
        import jsonschema

        self.description = description
        self._routes: list[tuple[str, re.Pattern[str], Any, bool]] = []
        extracted = _operations(str(description))
        for key, operation in extracted["operations"].items():
            method, template = key.split(" ", 1)
            schema = operation["schema"]
            validator = jsonschema.Draft4Validator(schema) if schema else None
            self._routes.append((method, _pattern(template), validator, operation["required"]))
        self._answers: list[tuple[str, re.Pattern[str], str, Any]] = []
        for key, schema in extracted["responses"].items():
            method, template, status = key.split(" ")
            self._answers.append((method, _pattern(template), status, jsonschema.Draft4Validator(schema)))

    @classmethod
    def installed(cls) -> "GitHubOpenApi | None":
        found = default_description()
        return cls(found) if found is not None else None

    def problems(self, method: str, path: str, body: Any) -> list[str]:
        """Empty when the body fits the operation's schema (or the operation takes none we check)."""
        for route_method, pattern, validator, required in self._routes:
            if route_method == method and pattern.match(path.split("?", 1)[0]):
                if validator is None or (body is None and not required):
                    return []
                return _messages(validator, body)
        return []

    def answer_problems(self, method: str, path: str, status: int, body: Any) -> list[str]:
        """Empty when an answer fits GitHub's response schema for it (or it is one we do not check)."""
        for answer_method, pattern, answer_status, validator in self._answers:
            if answer_method == method and answer_status == str(status) and pattern.match(path.split("?", 1)[0]):
                return _messages(validator, body)
        return []
