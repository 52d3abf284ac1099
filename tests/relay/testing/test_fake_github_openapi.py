"""The fake GitHub checks request bodies against GitHub's published REST description
(relay/testing/github_openapi.py): what GitHub would refuse is answered 422 and recorded."""

from __future__ import annotations

import pytest

from relay.testing import FakeGitHub
from relay.testing.github_openapi import default_description
from relay.testing import loopback_client

pytestmark = pytest.mark.skipif(
    default_description() is None,
    reason="GitHub's REST description is not installed: npm install --prefix .octokit @octokit/openapi (.ci/run does)",
)


def test_bodies_off_the_description_are_refused_and_recorded():
    with FakeGitHub() as fake:
        headers = {"Authorization": "token test-token"}
        good = loopback_client().post(f"{fake.url}/repos/o/r/statuses/{'a' * 40}", headers=headers,
                          json={"state": "success", "context": "crcr/x", "description": None})
        assert good.status_code == 201
        bad = loopback_client().post(f"{fake.url}/repos/o/r/statuses/{'a' * 40}", headers=headers,
                         json={"state": "success", "context": 7})
        assert bad.status_code == 422 and "context: 7 is not of type 'string'" in bad.json()["message"]
        dispatch = loopback_client().post(f"{fake.url}/repos/o/r/dispatches", headers=headers,
                              json={"event_type": "push", "client_payload": {f"k{i}": i for i in range(11)}})
        assert dispatch.status_code == 422 and "No more than 10 properties" in dispatch.json()["message"]
        assert [(m, p) for m, p, _ in fake.schema_violations] == [
            ("POST", f"/repos/o/r/statuses/{'a' * 40}"), ("POST", "/repos/o/r/dispatches")]
        assert len(fake.statuses) == 1  # the refused status was not recorded as created


def test_file_and_branch_answers_fit_githubs_response_schemas():
    with FakeGitHub() as fake:
        headers = {"Authorization": "token test-token"}
        fake.add_file("o/r", "backends/a.yaml", "name: a\n")
        file = loopback_client().get(f"{fake.url}/repos/o/r/contents/backends/a.yaml?ref=main", headers=headers).json()
        head = loopback_client().get(f"{fake.url}/repos/o/r/git/ref/heads/main", headers=headers).json()["object"]["sha"]
        assert loopback_client().post(f"{fake.url}/repos/o/r/git/refs", headers=headers,
                          json={"ref": "refs/heads/x/y", "sha": head}).status_code == 201
        put = loopback_client().put(f"{fake.url}/repos/o/r/contents/backends/a.yaml", headers=headers,
                        json={"message": "m", "content": "bmFtZTogYgo=", "sha": file["sha"], "branch": "x/y"})
        assert put.status_code == 200
        assert loopback_client().patch(f"{fake.url}/repos/o/r/git/refs/heads/x/y", headers=headers,
                           json={"sha": head, "force": True}).status_code == 200
        assert fake.answer_violations == [] and fake.schema_violations == []
        # The check is live: an answer missing a required field is recorded.
        assert fake.openapi.answer_problems("GET", "/repos/o/r/git/ref/heads/main", 200, {"ref": "x"}) == [
            "<body>: 'node_id' is a required property", "<body>: 'url' is a required property",
            "<body>: 'object' is a required property"]


def test_off_switch():
    with FakeGitHub(check_bodies=False) as fake:
        assert fake.openapi is None
