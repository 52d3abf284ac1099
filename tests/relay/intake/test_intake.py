"""Intake behaviour with the store: dedupe, ignored events, store failures, big payloads, routing per level and label."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
from sqlalchemy import create_engine, text

from relay.intake.events import CLIENT_PAYLOAD_MAX_BYTES
from relay.store.database import normalise_url
from tests.relay.helpers import pr_payload, push_payload

ALL = ["l1", "l2", "l3", "l4"]


@pytest.fixture
def relay(relay_factory, database_url):
    return relay_factory(database_url)


def test_redelivery_answers_duplicate_and_dispatches_nothing_new(relay):
    first = relay.post("pull_request", pr_payload(), delivery="dup-1")
    assert first.status_code == 202 and sorted(first.json()["dispatches"]) == ALL
    relay.wait_settled()
    again = relay.post("pull_request", pr_payload(), delivery="dup-1")
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    relay.wait_settled()
    assert len(relay.store.dispatches()) == 4
    assert len(relay.fake.dispatches()) == 4


def test_concurrent_redeliveries_store_one_copy(relay):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: relay.post("push", push_payload(), delivery="race-1"), range(8)))
    statuses = sorted(a.json()["status"] for a in answers)
    assert statuses == ["duplicate"] * 7 + ["queued"], statuses
    relay.wait_settled()
    assert sorted(d.backend for d in relay.store.dispatches()) == ALL


@pytest.mark.parametrize("event", ["star", "workflow_run", "pull_request_review"])
def test_unhandled_events_are_2xx_with_a_reason(relay, event):
    response = relay.post(event, {"action": "created", "repository": {"full_name": "pytorch/pytorch"}})
    assert response.status_code == 200
    assert response.json()["status"] == "ignored" and event in response.json()["reason"]
    assert relay.store.dispatches() == []


@pytest.mark.parametrize("action", ["edited", "assigned", "review_requested"])
def test_unhandled_pull_request_actions_are_ignored(relay, action):
    response = relay.post("pull_request", pr_payload(action))
    assert response.status_code == 200 and f"pull_request.{action}" in response.json()["reason"]
    assert relay.store.dispatches() == []


def test_other_repository_is_ignored(relay):
    response = relay.post("pull_request", pr_payload(repository="someone/fork"))
    assert response.status_code == 200 and response.json()["status"] == "ignored"
    assert "someone/fork" in response.json()["reason"]


def test_payload_missing_a_needed_field_is_400_naming_it(relay):
    payload = pr_payload()
    del payload["pull_request"]["head"]["sha"]
    response = relay.post("pull_request", payload, delivery="broken-1")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_payload" and "pull_request.head.sha" in response.json()["detail"]
    assert "broken-1" in response.json()["detail"]
    assert relay.store.delivery("broken-1") is None


def test_store_failure_is_503_and_nothing_is_dispatched(relay, database_url):
    engine = create_engine(normalise_url(database_url))
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE deliveries RENAME TO deliveries_gone"))
    engine.dispose()
    response = relay.post("pull_request", pr_payload(), delivery="lost-1")
    assert response.status_code == 503
    assert response.json()["error"] == "store_unavailable" and "lost-1" in response.json()["detail"]
    assert relay.fake.requests == []


def test_one_megabyte_pull_request_body_dispatches_under_the_limits(relay):
    payload = pr_payload(body="x" * 1_000_000, labels=tuple(f"label-{i}" for i in range(60)))
    assert len(json.dumps(payload)) > 1_000_000
    response = relay.post("pull_request", payload, delivery="big-1")
    assert response.status_code == 202
    relay.wait_settled()
    sent = relay.fake.dispatches()
    assert len(sent) == 4  # the fake answers 422 to anything over GitHub's limits
    for item in sent:
        assert len(json.dumps(item["client_payload"]).encode()) < CLIENT_PAYLOAD_MAX_BYTES
        assert len(item["client_payload"]) < 10
        assert len(item["client_payload"]["pull_request"]["labels"]) == 60
    assert {d.state for d in relay.store.dispatches()} == {"sent"}


def test_long_display_strings_are_cut_to_stay_under_the_limits(relay):
    # Labels and titles are display text: cut. A ref or sha over its limit is refused (test_hostile_intake).
    payload = pr_payload(labels=tuple("L" * 400 + str(i) for i in range(150)))
    payload["pull_request"]["title"] = "t" * 5000
    assert relay.post("pull_request", payload).status_code == 202
    relay.wait_settled()
    for item in relay.fake.dispatches():
        client = item["client_payload"]
        assert len(client["pull_request"]["labels"]) == 100
        assert {len(label) for label in client["pull_request"]["labels"]} == {255}
    assert {d.state for d in relay.store.dispatches()} == {"sent"}


def test_labels_too_large_for_github_even_when_cut_are_left_out_and_the_pr_still_dispatched(relay):
    # JSON escapes each character outside the BMP as 12 bytes: 99 such labels stay over 64 KB after the cuts.
    labels = tuple(f"{i:02d}" + "\U0001F680" * 60 for i in range(99)) + ("ciflow/crcr/l4",)
    payload = pr_payload(labels=labels)
    assert relay.post("pull_request", payload, delivery="emoji-1").status_code == 202
    relay.wait_settled()
    sent = relay.fake.dispatches()
    assert len(sent) == 4 and {d.state for d in relay.store.dispatches()} == {"sent"}  # the fake checks the limit
    for item in sent:
        pr = item["client_payload"]["pull_request"]
        assert len(json.dumps(item["client_payload"]).encode()) < CLIENT_PAYLOAD_MAX_BYTES
        kept = pr["labels"]
        assert kept[-1] == "ciflow/crcr/l4" and kept[:-1] == list(labels[:len(kept) - 1])  # in order, a prefix
        assert pr["labels_omitted"] == 100 - len(kept) > 0
    small = pr_payload(labels=("a", "ciflow/crcr/l4"))
    assert relay.post("pull_request", small, delivery="small-1").status_code == 202
    relay.wait_settled()
    assert "labels_omitted" not in relay.fake.dispatches()[-1]["client_payload"]["pull_request"]  # only when needed


def test_client_payloads_differ_only_in_their_nonce():
    from relay.intake.events import client_payloads, normalise

    event = normalise("pull_request", "d-1", pr_payload(labels=("a", "b")))
    first, second = client_payloads(event, ["n" * 32, "m" * 32])
    assert first["nonce"] == "n" * 32 and second["nonce"] == "m" * 32
    assert {**first, "nonce": None} == {**second, "nonce": None}
    assert first["pull_request"]["labels"] == ["a", "b"] and first["delivery"] == "d-1"
    assert client_payloads(event, []) == []


# --- routing per level and label -------------------------------------------------------------------

@pytest.mark.parametrize("action", ["opened", "reopened", "synchronize", "closed"])
def test_pull_request_actions_go_to_every_level(relay, action):
    response = relay.post("pull_request", pr_payload(action))
    assert response.status_code == 202 and sorted(response.json()["dispatches"]) == ALL
    relay.wait_settled()
    assert sorted(r.repository for r in relay.fake.requests if r.endpoint == "dispatches") == [f"org/{name}-ci" for name in ALL]
    assert {d["event_type"] for d in relay.fake.dispatches()} == {f"pull_request.{action}"}


def test_backend_without_relay_section_gets_nothing(relay):
    relay.post("push", push_payload())
    relay.wait_settled()
    assert "local" not in {d.backend for d in relay.store.dispatches()}
    assert {b.name for b in relay.store.backends()} == set(ALL)


def test_label_events_reach_only_the_labels_backend_and_labels_are_tracked(relay):
    labeled = relay.post("pull_request", pr_payload("labeled", labels=("ciflow/crcr/l3",), label="ciflow/crcr/l3",
                                                    updated_at="2024-05-01T10:00:01Z"))
    assert labeled.status_code == 202 and labeled.json()["dispatches"] == ["l3"]
    assert relay.store.pull_request_labels("pytorch/pytorch", 7) == ("ciflow/crcr/l3",)

    other = relay.post("pull_request", pr_payload("labeled", labels=("ciflow/crcr/l3", "bug"), label="bug",
                                                  updated_at="2024-05-01T10:00:02Z"))
    assert other.status_code == 202 and other.json()["status"] == "recorded"
    assert "'bug' belongs to no allowlisted backend" in other.json()["reason"]
    assert relay.store.pull_request_labels("pytorch/pytorch", 7) == ("ciflow/crcr/l3", "bug")

    unlabeled = relay.post("pull_request", pr_payload("unlabeled", labels=("bug",), label="ciflow/crcr/l3",
                                                      updated_at="2024-05-01T10:00:03Z"))
    assert unlabeled.json()["dispatches"] == ["l3"]
    assert relay.store.pull_request_labels("pytorch/pytorch", 7) == ("bug",)

    # A late redelivery of an older event does not bring the removed label back.
    late = relay.post("pull_request", pr_payload("synchronize", labels=("ciflow/crcr/l3", "bug"),
                                                 updated_at="2024-05-01T10:00:02Z"))
    assert late.status_code == 202
    assert relay.store.pull_request_labels("pytorch/pytorch", 7) == ("bug",)
    relay.wait_settled()
    l3 = [d for d in relay.fake.dispatches("org/l3-ci")]
    assert [d["event_type"] for d in l3] == ["pull_request.labeled", "pull_request.unlabeled", "pull_request.synchronize"]


def test_custom_label_from_the_descriptor(relay_factory, database_url, backends_dir):
    from tests.relay.helpers import write_backend

    write_backend(backends_dir, "npu", "org/npu-ci", "L3", label="ci/npu-please")
    relay = relay_factory(database_url)
    response = relay.post("pull_request", pr_payload("labeled", labels=("ci/npu-please",), label="ci/npu-please"))
    assert response.json()["dispatches"] == ["npu"]
