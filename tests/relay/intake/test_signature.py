"""Intake refusals: signature (GitHub's test vector, wrong secret, rotation), headers, size, content type.

These exercise the HTTP layer before anything is stored, so they run on SQLite only.
"""

from __future__ import annotations

import json

import httpx
import pytest

from relay.intake.routes import signature_matches
from relay.testing import loopback_client
from tests.relay.helpers import SECRET, pr_payload, sign

VECTOR_SECRET = b"It's a Secret to Everybody"
VECTOR_BODY = b"Hello, World!"
VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_published_test_vector():
    assert signature_matches(VECTOR_BODY, VECTOR_SIGNATURE, [VECTOR_SECRET])
    assert signature_matches(VECTOR_BODY, VECTOR_SIGNATURE.upper().replace("SHA256=", "sha256="), [VECTOR_SECRET])
    assert not signature_matches(VECTOR_BODY + b" ", VECTOR_SIGNATURE, [VECTOR_SECRET])
    assert not signature_matches(VECTOR_BODY, VECTOR_SIGNATURE, [b"another secret"])
    assert signature_matches(VECTOR_BODY, VECTOR_SIGNATURE, [b"old", VECTOR_SECRET])
    assert not signature_matches(VECTOR_BODY, VECTOR_SIGNATURE.replace("sha256=", "sha1="), [VECTOR_SECRET])


@pytest.fixture
def relay(relay_factory, sqlite_url):
    return relay_factory(sqlite_url, webhook_secrets=f"{SECRET}, rotated-secret", max_body_bytes=200_000)


def _error(response: httpx.Response, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error, body
    return body["detail"]


def test_test_vector_over_http(relay_factory, sqlite_url):
    relay = relay_factory(sqlite_url, webhook_secrets=VECTOR_SECRET.decode())
    response = loopback_client().post(
        f"{relay.url}/github/webhook", content=VECTOR_BODY,
        headers={"X-Hub-Signature-256": VECTOR_SIGNATURE, "X-GitHub-Event": "ping",
                 "X-GitHub-Delivery": "d-1", "Content-Type": "application/json"},
    )
    # The vector's body is not JSON: the signature passed, the JSON check refuses it.
    assert "not valid JSON" in _error(response, 400, "invalid_json")


def test_wrong_secret_is_401(relay):
    detail = _error(relay.post("pull_request", pr_payload(), secret="guess"), 401, "signature_mismatch")
    assert "RELAY_WEBHOOK_SECRETS" in detail
    assert relay.fake.requests == [] and relay.store.dispatches() == []


def test_both_secrets_are_accepted_during_rotation(relay):
    # Two events (two bodies): one body twice under two delivery ids would be a replay, answered duplicate.
    assert relay.post("pull_request", pr_payload(number=1), secret=SECRET).status_code == 202
    assert relay.post("pull_request", pr_payload(number=2), secret="rotated-secret").status_code == 202
    assert relay.post("pull_request", pr_payload(number=3), secret="retired-secret").status_code == 401


def test_missing_signature_is_401(relay):
    detail = _error(relay.post("pull_request", pr_payload(), headers={"X-Hub-Signature-256": None}), 401, "signature_missing")
    assert "X-Hub-Signature-256" in detail


@pytest.mark.parametrize("value", ["sha256=abc", "sha1=" + "0" * 40, "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", ""])
def test_malformed_signature_is_401(relay, value):
    detail = _error(relay.post("pull_request", pr_payload(), headers={"X-Hub-Signature-256": value}), 401,
                    "signature_malformed")
    assert "X-Hub-Signature-256" in detail


def test_signature_is_checked_before_other_headers(relay):
    response = relay.post("pull_request", pr_payload(), secret="guess", headers={"X-GitHub-Event": None, "Content-Type": "text/plain"})
    _error(response, 401, "signature_mismatch")


def test_missing_event_header_is_400(relay):
    assert "X-GitHub-Event" in _error(relay.post("pull_request", pr_payload(), headers={"X-GitHub-Event": None}), 400, "event_header")


@pytest.mark.parametrize("delivery", [None, "not a guid!", "x" * 101])
def test_missing_or_malformed_delivery_is_400(relay, delivery):
    headers = {"X-GitHub-Delivery": delivery}
    response = relay.post("pull_request", pr_payload(), headers=headers) if delivery else relay.post(
        "pull_request", pr_payload(), headers={"X-GitHub-Delivery": None})
    assert "X-GitHub-Delivery" in _error(response, 400, "delivery_header")


def test_form_encoded_webhook_is_415(relay):
    body = b"payload=" + json.dumps(pr_payload()).encode()
    response = relay.post("pull_request", body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert "application/json" in _error(response, 415, "unsupported_media_type")


def test_signed_body_that_is_not_json_is_400(relay):
    _error(relay.post("pull_request", b"{not json"), 400, "invalid_json")
    _error(relay.post("pull_request", b"[1, 2]"), 400, "invalid_json")


def test_too_large_is_413_by_content_length(relay):
    body = json.dumps(pr_payload(body="x" * 300_000)).encode()
    detail = _error(relay.post("pull_request", body), 413, "payload_too_large")
    assert "RELAY_MAX_BODY_BYTES" in detail
    assert relay.store.dispatches() == []


def test_too_large_is_413_when_streamed_without_length(relay):
    body = json.dumps(pr_payload(body="x" * 300_000)).encode()

    def chunks():
        for start in range(0, len(body), 65536):
            yield body[start:start + 65536]

    response = loopback_client().post(f"{relay.url}/github/webhook", content=chunks(), headers={
        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "d-stream", "X-Hub-Signature-256": sign(body),
        "Content-Type": "application/json"})
    _error(response, 413, "payload_too_large")


def test_ping_is_200(relay):
    response = relay.post("ping", {"zen": "Keep it logically awesome.", "hook_id": 1})
    assert response.status_code == 200 and response.json()["status"] == "pong"
