"""The fake GitHub's dispatches area: ``POST /repos/{o}/{r}/dispatches``: GitHub's limits on event_type and client_payload, and the bodies received.

A mixin of :class:`relay.testing.fake_github.server.FakeGitHub`, whose ``__init__`` makes the state it
uses and whose ``handle`` calls its ``_on_<endpoint>`` answers.
"""

from __future__ import annotations

import json
from typing import Any


class Dispatches:
    """``repository_dispatch``: GitHub's own limits, and the bodies it accepted."""

    def dispatches(self, repository: str | None = None, *, accepted_only: bool = True) -> list[dict[str, Any]]:
        """Bodies of repository_dispatch calls (those answered 204 unless ``accepted_only=False``)."""
        return [
            r.json for r in self.requests
            if r.endpoint == "dispatches" and (repository is None or r.repository == repository.lower())
            and (r.answered == 204 or not accepted_only)
        ]

    def _on_dispatches(self, params, repo, body):
        if not isinstance(body, dict):
            return 400, {}, {"message": "Problems parsing JSON"}
        event_type = body.get("event_type")
        if not isinstance(event_type, str) or not 1 <= len(event_type) <= 100:
            return 422, {}, {"message": "Invalid request.\n\nevent_type must be 1 to 100 characters"}
        payload = body.get("client_payload", {})
        if not isinstance(payload, dict):
            return 422, {}, {"message": "Invalid request.\n\nclient_payload is not an object"}
        if len(payload) > 10:
            return 422, {}, {"message": "Invalid request.\n\nNo more than 10 properties are allowed; "
                                        f"{len(payload)} were supplied."}
        if len(json.dumps(payload).encode()) >= 64 * 1024:
            return 422, {}, {"message": "client_payload is too large"}
        return 204, {}, None
