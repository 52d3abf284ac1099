"""Hostile webhooks over real HTTP: every field the relay keeps is validated at intake (a 400 naming the
field, nothing stored), deep JSON is a 400, and a replayed signed body under a fresh delivery id is a duplicate."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.relay.helpers import pr_payload, push_payload


@pytest.fixture
def relay(relay_factory, database_url):
    return relay_factory(database_url)


@pytest.fixture
def sqlite_relay(relay_factory, sqlite_url):
    return relay_factory(sqlite_url)


def _refused(response, delivery: str, field: str) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] in ("invalid_payload", "invalid_unicode"), body
    assert field in body["detail"] and delivery in body["detail"], body
    return body["detail"]


def test_lone_surrogate_in_a_kept_string_is_400_naming_it_and_later_webhooks_still_work(relay):
    payload = pr_payload()
    body = json.dumps(payload).replace('"Fix things"', '"\\ud800"').encode()
    detail = _refused(relay.post("pull_request", body, delivery="surrogate-1"), "surrogate-1", "pull_request.title")
    assert "Unicode" in detail
    assert relay.store.delivery("surrogate-1") is None and relay.store.dispatches() == []
    # A valid surrogate pair (an emoji) is ordinary text and is accepted.
    emoji = json.dumps(pr_payload(number=8)).replace('"Fix things"', '"\\ud83d\\ude80 rocket"').encode()
    assert relay.post("pull_request", emoji, delivery="emoji-ok").status_code == 202
    relay.wait_settled()
    runs = relay.store.runs(pr_number=8)  # the title reaches the run rows written at dispatch
    assert len(runs) == 4 and {r.title for r in runs} == {"\U0001f680 rocket"}


@pytest.mark.parametrize("number", [2**70, 2**31, 0, -3, True, "7", 7.5])
def test_pull_request_number_out_of_range_or_not_an_integer_is_400(sqlite_relay, number):
    payload = pr_payload()
    payload["pull_request"]["number"] = number
    _refused(sqlite_relay.post("pull_request", payload, delivery="number-1"), "number-1", "pull_request.number")
    assert sqlite_relay.store.delivery("number-1") is None


@pytest.mark.parametrize("field, value", [
    ("pull_request.head.sha", "g" * 40), ("pull_request.head.sha", "a" * 39), ("pull_request.base.sha", "A" * 41),
    ("pull_request.head.ref", "r" * 256), ("pull_request.base.ref", 5), ("pull_request.state", "merged-ish" * 3),
    ("pull_request.updated_at", "2024" * 20), ("pull_request.html_url", "https://x/" + "p" * 2000),
    ("pull_request.draft", "yes"), ("repository.full_name", "pytorch/pytorch" + "x" * 200),
    ("sender.login", "l" * 256), ("action", "o" * 65),
])
def test_bad_pull_request_fields_are_400_naming_the_field(sqlite_relay, field, value):
    payload = pr_payload()
    *parents, leaf = field.split(".")
    target = payload
    for part in parents:
        target = target[part]
    target[leaf] = value
    if field == "repository.full_name":  # another repository is ignored before validation: keep it upstream-like
        sqlite_relay.parts.settings = sqlite_relay.parts.settings.model_copy(update={"upstream_repo": value})
    _refused(sqlite_relay.post("pull_request", payload, delivery="field-1"), "field-1", field)
    assert sqlite_relay.store.delivery("field-1") is None


@pytest.mark.parametrize("field, value", [("after", "0" * 39), ("before", "x" * 40), ("ref", "r" * 300), ("deleted", "no")])
def test_bad_push_fields_are_400_naming_the_field(sqlite_relay, field, value):
    payload = push_payload()
    payload[field] = value
    _refused(sqlite_relay.post("push", payload, delivery="push-1"), "push-1", field)


def test_bad_fields_of_stored_events_are_400(sqlite_relay):
    comment = {"action": "created", "issue": {"number": 2**70, "pull_request": {}},
               "comment": {"body": "/retest", "author_association": "MEMBER", "user": {"login": "m"}},
               "repository": {"full_name": "pytorch/pytorch"}, "sender": {"login": "m"}}
    _refused(sqlite_relay.post("issue_comment", comment, delivery="c-1"), "c-1", "issue.number")
    check = {"action": "rerequested", "check_run": {"name": "crcr/l4", "head_sha": "nope", "external_id": "1"},
             "repository": {"full_name": "pytorch/pytorch"}, "sender": {"login": "m"}}
    _refused(sqlite_relay.post("check_run", check, delivery="k-1"), "k-1", "check_run.head_sha")


def test_deeply_nested_webhook_is_400_not_500(sqlite_relay):
    body = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    response = sqlite_relay.post("pull_request", body, delivery="deep-1")
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_json" and "nests deeper" in response.json()["detail"]
    shallow_but_over = b'{"a":' * 80 + b"1" + b"}" * 80
    assert sqlite_relay.post("pull_request", shallow_but_over, delivery="deep-2").status_code == 400


def test_a_signed_body_replayed_under_fresh_delivery_ids_is_a_duplicate(relay):
    import concurrent.futures

    body = json.dumps(pr_payload(number=30)).encode()
    first = relay.post("pull_request", body, delivery="orig-1")
    assert first.status_code == 202 and len(first.json()["dispatches"]) == 4
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replays = list(pool.map(lambda i: relay.post("pull_request", body, delivery=f"replay-{i}"), range(6)))
    assert [(r.status_code, r.json()["status"]) for r in replays] == [(200, "duplicate")] * 6
    # GitHub's own redelivery keeps the delivery id: still answered duplicate, nothing new.
    assert relay.post("pull_request", body, delivery="orig-1").json()["status"] == "duplicate"
    relay.wait_settled()
    assert len(relay.store.dispatches()) == 4 and len(relay.fake.dispatches()) == 4
    assert all(relay.store.delivery(f"replay-{i}") is None for i in range(6))
    # Another body (the same event a moment later) is a new delivery.
    later = pr_payload(number=30, updated_at="2024-05-01T10:00:09Z")
    assert relay.post("pull_request", later, delivery="next-1").status_code == 202


def test_a_signed_body_is_a_duplicate_only_within_the_replay_window(relay):
    from sqlalchemy import text

    body = json.dumps(pr_payload(number=31)).encode()
    assert relay.post("pull_request", body, delivery="window-1").status_code == 202
    assert relay.post("pull_request", body, delivery="window-2").json()["status"] == "duplicate"
    hours = relay.parts.settings.replay_window_hours
    with relay.store.engine.begin() as connection:  # the first copy was stored longer ago than the window
        old = connection.execute(text("SELECT received_at FROM deliveries WHERE delivery_id = 'window-1'")).scalar_one()
        old = old if not isinstance(old, str) else dt.datetime.fromisoformat(old)
        connection.execute(text("UPDATE deliveries SET received_at = :at WHERE delivery_id = 'window-1'"),
                           {"at": old - dt.timedelta(hours=hours, minutes=1)})
    again = relay.post("pull_request", body, delivery="window-3")
    assert again.status_code == 202 and again.json()["status"] == "queued"
    # Within the window of that new copy, the body is a duplicate again; GitHub's redelivery of the old
    # delivery keeps its id and stays a duplicate.
    assert relay.post("pull_request", body, delivery="window-4").json()["status"] == "duplicate"
    assert relay.post("pull_request", body, delivery="window-1").json()["status"] == "duplicate"
    relay.wait_settled()
    assert len(relay.store.dispatches()) == 8


def test_concurrent_replays_under_fresh_ids_store_one_copy(relay):
    import concurrent.futures

    body = json.dumps(push_payload(after="e" * 40)).encode()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: relay.post("push", body, delivery=f"race-{i}"), range(8)))
    assert sorted(a.json()["status"] for a in answers) == ["duplicate"] * 7 + ["queued"]
    relay.wait_settled()
    assert len(relay.store.dispatches()) == 4


def _raw_request(url: str, headers: dict[str, str], first_bytes: bytes):
    """A socket that sent the request line, headers and ``first_bytes`` of the body, and then stalls."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": parts.netloc, **headers}.items())
    sock.sendall(f"POST /github/webhook HTTP/1.1\r\n{head}\r\n".encode() + first_bytes)
    return sock


def _status_of(sock) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1])


def test_unauthenticated_bodies_share_a_bounded_budget(relay_factory, sqlite_url):
    relay = relay_factory(sqlite_url, unauthenticated_body_budget_bytes=1_000_000, max_body_bytes=2_000_000)
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": "slow-1",
               "X-Hub-Signature-256": "sha256=" + "0" * 64}
    held = _raw_request(relay.url, {**headers, "Content-Length": "900000"}, b"{" * 1000)
    try:
        import time

        # The held upload's reservation is visible once the relay started reading it.
        deadline = time.monotonic() + 20
        while relay.parts.body_budget.used < 900_000:
            assert time.monotonic() < deadline, "the relay never started reading the held body"
            time.sleep(0.01)
        refused = relay.post("push", b"{" + b" " * 499_000 + b"}", delivery="big-2")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "busy" and "RELAY_UNAUTHENTICATED_BODY_BUDGET_BYTES" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert relay.post("push", push_payload(), delivery="small-1").status_code == 202  # small webhooks still fit
    finally:
        held.close()


def test_a_stalled_body_is_answered_408(relay_factory, sqlite_url):
    relay = relay_factory(sqlite_url, body_read_timeout_seconds=0.5)
    sock = _raw_request(relay.url, {"Content-Type": "application/json", "Content-Length": "5000",
                                    "X-GitHub-Event": "push", "X-GitHub-Delivery": "stall-1"}, b'{"a": ')
    try:
        assert _status_of(sock) == 408
    finally:
        sock.close()
    assert relay.parts.body_budget.used == 0
