"""Every real GitHub payload in ../shared/github-payloads is accepted and routed as its event and action say.

The payloads come from a sample repository, so each test sets RELAY_UPSTREAM_REPO to that repository.
"""

from __future__ import annotations

import json

import pytest

from relay.intake.events import CLIENT_PAYLOAD_MAX_BYTES, CLIENT_PAYLOAD_MAX_KEYS
from tests.relay.helpers import PAYLOADS_DIR, write_backend

pytestmark = pytest.mark.skipif(
    not PAYLOADS_DIR.is_dir(),
    reason=f"real GitHub payloads not found at {PAYLOADS_DIR} (set RELAY_TEST_PAYLOADS_DIR to the github-payloads folder)",
)

ALL_BACKENDS = ["l1", "l2", "l3", "l4"]


def _load(name: str) -> tuple[str, dict, bytes]:
    path = PAYLOADS_DIR / f"{name}.payload.json"
    if not path.exists():
        path = PAYLOADS_DIR / f"{name}.json"
    body = path.read_bytes()
    return name.split("__", 1)[0], json.loads(body), body


@pytest.fixture
def relay(relay_factory, database_url, backends_dir):
    # A backend whose label is the one the labeled sample adds ("bug").
    write_backend(backends_dir, "bugwatch", "org/bugwatch-ci", "L3", label="bug")
    return relay_factory(database_url, upstream_repo="Codertocat/Hello-World")


def _expected_pull_request(payload: dict) -> dict:
    pr = payload["pull_request"]
    return {"head": {"sha": pr["head"]["sha"], "ref": pr["head"]["ref"]},
            "base": {"sha": pr["base"]["sha"], "ref": pr["base"]["ref"]},
            "number": pr["number"], "labels": [label["name"] for label in pr["labels"]]}


def _check_client_payload(sent: dict, event: str, payload: dict, delivery: str) -> None:
    client = sent["client_payload"]
    assert len(client) < CLIENT_PAYLOAD_MAX_KEYS
    assert len(json.dumps(client).encode()) < CLIENT_PAYLOAD_MAX_BYTES
    assert client["event"] == event and client["delivery"] == delivery
    assert client["action"] == payload.get("action")
    assert client["repository"] == payload["repository"]["full_name"]
    assert client["sender"] == payload["sender"]["login"]
    assert len(client["nonce"]) >= 32


@pytest.mark.parametrize("name", ["pull_request__opened", "pull_request__synchronize"])
def test_pull_request_goes_to_every_backend(relay, name):
    event, payload, body = _load(name)
    response = relay.post(event, body, delivery=f"{name}-1")
    assert response.status_code == 202, response.text
    assert sorted(response.json()["dispatches"]) == sorted(ALL_BACKENDS + ["bugwatch"])
    relay.wait_settled()
    sent = relay.fake.dispatches()
    assert sorted(s["client_payload"]["nonce"] for s in sent) == sorted(d.nonce for d in relay.store.dispatches())
    for item in sent:
        assert item["event_type"] == f"pull_request.{payload['action']}"
        _check_client_payload(item, event, payload, f"{name}-1")
        expected = _expected_pull_request(payload)
        client = item["client_payload"]
        assert client["head"] == expected["head"] and client["base"] == expected["base"]
        assert client["pull_request"]["number"] == expected["number"]
        assert client["pull_request"]["labels"] == expected["labels"]
    assert relay.store.pull_request_labels("Codertocat/Hello-World", payload["number"]) == ("bug",)


def test_labeled_goes_only_to_the_backend_of_that_label(relay):
    event, payload, body = _load("pull_request__labeled")
    response = relay.post(event, body, delivery="labeled-1")
    assert response.status_code == 202 and response.json()["dispatches"] == ["bugwatch"]
    relay.wait_settled()
    [sent] = relay.fake.dispatches()
    assert relay.fake.requests[0].repository == "org/bugwatch-ci"
    assert sent["event_type"] == "pull_request.labeled"
    _check_client_payload(sent, event, payload, "labeled-1")
    assert sent["client_payload"]["pull_request"]["changed_label"] == "bug"


def test_push_of_a_deleted_tag_is_recorded_not_dispatched(relay):
    event, payload, body = _load("push__with-installation")
    assert payload["deleted"] is True
    response = relay.post(event, body, delivery="push-1")
    assert response.status_code == 202
    assert response.json()["status"] == "recorded" and "no commit to test" in response.json()["reason"]
    assert relay.store.dispatches() == []
    assert relay.store.delivery("push-1").event == "push"


def test_push_of_a_branch_goes_to_every_backend(relay):
    event, payload, _ = _load("push__with-installation")
    payload = {**payload, "deleted": False, "ref": "refs/heads/main", "after": "e" * 40}
    response = relay.post(event, payload, delivery="push-2")
    assert response.status_code == 202 and sorted(response.json()["dispatches"]) == sorted(ALL_BACKENDS + ["bugwatch"])
    relay.wait_settled()
    for item in relay.fake.dispatches():
        assert item["event_type"] == "push"
        _check_client_payload(item, event, payload, "push-2")
        assert item["client_payload"]["head"] == {"sha": "e" * 40, "ref": "refs/heads/main"}
        assert item["client_payload"]["pull_request"] is None


@pytest.mark.parametrize("name", ["issue_comment__created", "check_run__rerequested"])
def test_rerun_events_are_stored_for_the_results_side(relay_factory, database_url, name):
    event, payload, body = _load(name)
    relay = relay_factory(database_url, upstream_repo=payload["repository"]["full_name"])
    response = relay.post(event, body, delivery=f"{name}-1")
    assert response.status_code == 202 and response.json()["status"] == "stored"
    stored = relay.store.delivery(f"{name}-1")
    assert stored.event == event and stored.action == payload["action"]
    assert json.loads(stored.payload) == payload
    assert relay.store.dispatches() == []


def test_ping_sample(relay):
    event, payload, body = _load("ping__payload")
    response = relay.post(event, body)
    assert response.status_code == 200 and response.json() == {"status": "pong", "delivery": response.json()["delivery"],
                                                               "zen": payload["zen"]}


@pytest.mark.parametrize("name", ["pull_request__opened", "push__with-installation", "issue_comment__created"])
def test_samples_from_another_repository_are_ignored(relay_factory, database_url, name):
    relay = relay_factory(database_url, upstream_repo="pytorch/pytorch")
    event, _, body = _load(name)
    response = relay.post(event, body)
    assert response.status_code == 200
    assert response.json()["status"] == "ignored" and "RELAY_UPSTREAM_REPO" in response.json()["reason"]
    assert relay.store.dispatches() == []


# What each event/action must produce; a new sample with an unlisted kind fails here until it is added.
EXPECTED = {
    "ping": (200, "pong"),
    "pull_request.opened": (202, "queued"),
    "pull_request.synchronize": (202, "queued"),
    "pull_request.labeled": (202, "queued"),
    "push": (202, None),  # queued, or recorded when the push deleted its ref
    "issue_comment.created": (202, "stored"),
    "check_run.rerequested": (202, "stored"),
}
SAMPLES = sorted(p.name.removesuffix(".json") for p in PAYLOADS_DIR.glob("*.json")) if PAYLOADS_DIR.is_dir() else []


@pytest.mark.parametrize("name", SAMPLES)
def test_every_sample_is_accepted(relay_factory, database_url, backends_dir, name):
    name = name.removesuffix(".payload")
    event, payload, body = _load(name)
    write_backend(backends_dir, "bugwatch", "org/bugwatch-ci", "L3", label="bug")
    relay = relay_factory(database_url, upstream_repo=payload["repository"]["full_name"])
    kind = event if payload.get("action") is None else f"{event}.{payload['action']}"
    assert kind in EXPECTED, f"no expectation for sample {name} ({kind}); add one to EXPECTED"
    status, outcome = EXPECTED[kind]
    response = relay.post(event, body, delivery=f"sample-{name}")
    assert response.status_code == status, response.text
    if outcome is not None:
        assert response.json()["status"] == outcome
    assert relay.post(event, body, delivery=f"sample-{name}").json()["status"] in ("duplicate", "pong")
