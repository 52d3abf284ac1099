"""What the act end-to-end tests share: their skip conditions and GitHub's own pull_request sample."""

from __future__ import annotations

import copy
import json

import pytest

from relay.testing.github_openapi import default_description
from tests.relay.helpers import PAYLOADS_DIR

_SAMPLE = PAYLOADS_DIR / "pull_request__opened.payload.json"

ACT_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(default_description() is None,
                       reason="GitHub's REST description is not installed: npm install --prefix .octokit @octokit/openapi "
                              "(.ci/run does), or set GITHUB_OPENAPI_DESCRIPTION"),
    pytest.mark.skipif(not _SAMPLE.is_file(),
                       reason=f"real GitHub payloads not found at {PAYLOADS_DIR} (set RELAY_TEST_PAYLOADS_DIR)"),
]


def upstream_repository() -> str:
    """The repository GitHub's sample comes from: the relay's upstream in these tests."""
    return json.loads(_SAMPLE.read_text())["repository"]["full_name"]


def real_pr_webhook(number: int, head_sha: str) -> dict:
    """GitHub's own pull_request.opened sample, renumbered and pointed at ``head_sha``."""
    payload = copy.deepcopy(json.loads(_SAMPLE.read_text()))
    payload["number"] = payload["pull_request"]["number"] = number
    payload["pull_request"]["head"]["sha"] = head_sha
    return payload
