"""Dispatcher against every fault the fake GitHub can script: retries, rate limits, permanent failures, isolation."""

from __future__ import annotations

import time

import pytest

from relay.testing import Fault
from relay.testing import loopback_client
from tests.relay.helpers import pr_payload, push_payload, write_backend


@pytest.fixture
def one_backend(backends_dir):
    for path in backends_dir.glob("*.yaml"):
        path.unlink()
    write_backend(backends_dir, "solo", "org/solo-ci", "L2")
    return backends_dir


@pytest.fixture
def relay(relay_factory, database_url, one_backend):
    return relay_factory(database_url)


def _only_dispatch(relay):
    [row] = relay.store.dispatches()
    return row


def _attempt_times(relay, repository="org/solo-ci"):
    return [r.received_at for r in relay.fake.requests if r.endpoint == "dispatches" and r.repository == repository]


@pytest.mark.parametrize("fault", [Fault.server_error(500), Fault.server_error(502), Fault.server_error(503), Fault.dropped()],
                         ids=["500", "502", "503", "connection-dropped"])
def test_server_and_network_errors_are_retried(relay, fault):
    relay.fake.script(fault, fault)
    relay.post("push", push_payload())
    relay.wait_settled()
    row = _only_dispatch(relay)
    assert row.state == "sent" and row.attempts == 3 and row.last_status == 204
    assert len(_attempt_times(relay)) == 3 and len(relay.fake.dispatches()) == 1


def test_backoff_grows_between_attempts(relay_factory, database_url, one_backend):
    relay = relay_factory(database_url, dispatch_backoff_base_seconds=0.1, dispatch_backoff_max_seconds=5)
    relay.fake.script(Fault.server_error(), Fault.server_error(), Fault.server_error())
    relay.post("push", push_payload())
    relay.wait_settled()
    times = _attempt_times(relay)
    gaps = [b - a for a, b in zip(times, times[1:])]
    # equal jitter: attempt n waits between half and all of base * 2**(n-1)
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2, gaps


def test_gives_up_after_max_attempts_with_the_reason(relay_factory, database_url, one_backend):
    relay = relay_factory(database_url, dispatch_max_attempts=3)
    relay.fake.script(*[Fault.server_error(503)] * 5)
    relay.post("push", push_payload())
    relay.wait_settled()
    row = _only_dispatch(relay)
    assert row.state == "failed" and row.attempts == 3 and row.last_status == 503
    assert "gave up after 3 attempts" in row.last_error and "503" in row.last_error
    assert len(_attempt_times(relay)) == 3


@pytest.mark.parametrize(
    ("fault", "status", "words"),
    [
        (Fault.unprocessable("client_payload is too large"), 422, "client_payload is too large"),
        (Fault.not_found(), 404, "Not Found"),
    ],
    ids=["422", "404"],
)
def test_permanent_failures_are_recorded_and_not_retried(relay, fault, status, words):
    relay.fake.script(fault)
    relay.post("push", push_payload())
    relay.wait_settled()
    time.sleep(0.25)  # a retry, if any, would come within a backoff period (at most 0.2 s here)
    row = _only_dispatch(relay)
    assert row.state == "failed" and row.attempts == 1 and row.last_status == status
    assert words in row.last_error and "org/solo-ci" in row.last_error
    assert len(_attempt_times(relay)) == 1
    metrics = loopback_client().get(f"{relay.url}/metrics", timeout=10).text
    assert 'relay_dispatch_request_seconds_count{outcome="permanent"} 1.0' in metrics


def test_a_refused_token_pauses_its_credential_instead_of_failing_the_queue(relay_factory, database_url, one_backend, wait):
    relay = relay_factory(database_url, dispatch_credential_pause_seconds=1.0)
    relay.fake.revoke("test-token")
    for index in range(3):
        assert relay.post("push", push_payload(after=f"{index}" * 40)).status_code == 202
    wait(lambda: any(r.answered == 401 for r in relay.fake.requests), what="the 401")

    def readyz_if_paused():  # the fake has answered; the relay pauses once its client has read that answer
        health = loopback_client().get(f"{relay.url}/readyz", timeout=10)
        return health if health.status_code == 503 else None

    health = wait(readyz_if_paused, what="/readyz to answer 503 for the paused credential")
    assert health.json()["status"] == "credential_paused", health.text
    assert "credential token" in health.json()["detail"] and "Bad credentials" in health.json()["detail"]
    metrics = loopback_client().get(f"{relay.url}/metrics", timeout=10).text
    assert 'relay_credential_paused{credential="token"} 1.0' in metrics
    assert 'relay_dispatch_request_seconds_count{outcome="bad_credentials"}' in metrics
    rows = relay.store.dispatches()
    # Not a verdict on the rows: none failed, none used an attempt (each pause ends with one more try).
    assert {r.state for r in rows} <= {"queued", "sending"} and all(r.attempts == 0 for r in rows), rows
    relay.fake.revoked.discard("test-token")  # the credential is fixed
    relay.wait_settled()
    assert [r.state for r in relay.store.dispatches()] == ["sent"] * 3
    assert loopback_client().get(f"{relay.url}/readyz", timeout=10).status_code == 200
    assert 'relay_credential_paused{credential="token"} 0.0' in loopback_client().get(f"{relay.url}/metrics", timeout=10).text


def test_429_retry_after_is_honoured(relay):
    relay.fake.script(Fault.rate_limited(retry_after=0.5))
    relay.post("push", push_payload())
    relay.wait_settled()
    first, second = _attempt_times(relay)
    assert second - first >= 0.48
    row = _only_dispatch(relay)
    assert row.state == "sent" and row.attempts == 1  # rate limits do not use up attempts


def test_403_secondary_limit_backs_off_exponentially(relay_factory, database_url, one_backend):
    relay = relay_factory(database_url, github_secondary_backoff_seconds=0.2)
    relay.fake.script(Fault.secondary_limit(), Fault.secondary_limit())
    relay.post("push", push_payload())
    relay.wait_settled()
    times = _attempt_times(relay)
    assert len(times) == 3
    assert times[1] - times[0] >= 0.19 and times[2] - times[1] >= 0.39, times
    assert _only_dispatch(relay).state == "sent"


def test_403_secondary_limit_with_retry_after(relay):
    relay.fake.script(Fault.secondary_limit(retry_after=0.5))
    relay.post("push", push_payload())
    relay.wait_settled()
    first, second = _attempt_times(relay)
    assert second - first >= 0.48


def test_primary_limit_exhausted_waits_until_reset(relay):
    relay.fake.script(Fault.primary_exhausted(reset_in=1))
    relay.post("push", push_payload())
    relay.wait_settled()
    first, second = _attempt_times(relay)
    assert second - first >= 0.9
    assert int(relay.fake.requests[0].received_at) < int(relay.fake.requests[1].received_at) + 1


def test_rate_limit_rests_every_backend_of_the_credential(relay_factory, database_url, one_backend, wait):
    write_backend(one_backend, "other", "org/other-ci", "L1")
    relay = relay_factory(database_url)
    relay.fake.script(Fault.rate_limited(retry_after=0.6), repository="org/solo-ci")
    # Label events reach one backend each: first solo (answered 429), then other.
    relay.post("pull_request", pr_payload("labeled", labels=("ciflow/crcr/solo",), label="ciflow/crcr/solo"))
    # Counted once the dispatcher has taken the 429's rest (the fake's record of its answer comes earlier).
    wait(lambda: relay.parts.metrics.retries.labels("rate_limited")._value.get() >= 1, what="the 429's rest")
    relay.post("pull_request", pr_payload("labeled", labels=("ciflow/crcr/other",), label="ciflow/crcr/other"))
    relay.wait_settled()
    limited_at = next(r.received_at for r in relay.fake.requests if r.answered == 429)
    other_at = next(r.received_at for r in relay.fake.requests if r.repository == "org/other-ci")
    # Both backends use the same token, so "other" waits for the rest GitHub asked of that token.
    assert other_at - limited_at >= 0.58, (limited_at, other_at)


def test_slow_backend_does_not_delay_the_others(relay_factory, database_url, backends_dir):
    relay = relay_factory(database_url)
    relay.fake.script(Fault.slow(0.8), repository="org/l1-ci")
    posted = time.time()
    relay.post("pull_request", pr_payload())
    relay.wait_settled()
    answered = {r.repository: r.received_at for r in relay.fake.requests}
    assert answered["org/l1-ci"] - posted >= 0.8
    # l1's row is the oldest in the outbox: a serial dispatcher would reach the others only after its
    # slow answer. Compared with that answer rather than a wall-clock bound, so load cannot flake it.
    for name in ("l2", "l3", "l4"):
        assert answered[f"org/{name}-ci"] < answered["org/l1-ci"], answered


def test_failing_backend_does_not_block_the_others(relay_factory, database_url, backends_dir):
    relay = relay_factory(database_url, dispatch_max_attempts=2)
    relay.fake.script(*[Fault.server_error()] * 4, repository="org/l1-ci")
    for index in range(3):
        relay.post("push", push_payload(after=f"{index}" * 40))
    relay.wait_settled()
    states = {}
    for row in relay.store.dispatches():
        states.setdefault(row.backend, []).append(row.state)
    # l1 used up its 4 faults over 2 attempts per row (retries may overtake newer rows: order is best effort)
    assert states["l1"].count("failed") >= 1
    assert all(row.attempts <= 2 for row in relay.store.dispatches() if row.backend == "l1")
    assert all(s == ["sent"] * 3 for name, s in states.items() if name != "l1")


def test_per_backend_order_is_kept(relay_factory, database_url, one_backend):
    relay = relay_factory(database_url)
    actions = ["opened", "synchronize", "labeled", "synchronize", "closed"]
    for index, action in enumerate(actions):
        relay.post("pull_request", pr_payload(action, label="ciflow/crcr/solo", labels=("ciflow/crcr/solo",),
                                              updated_at=f"2024-05-01T10:00:0{index}Z"))
    relay.wait_settled()
    assert [d["event_type"] for d in relay.fake.dispatches()] == [f"pull_request.{a}" for a in actions]


def test_pacing_spreads_calls_per_credential(relay_factory, database_url, one_backend):
    relay = relay_factory(database_url, github_content_requests_per_minute=120)  # bucket of 120, then 2/s
    from relay.dispatch.dispatcher import CredentialGates

    gates = CredentialGates(relay.store, 6)  # a bucket of 6, refilled at one per 10 s
    assert all(gates.take("paced")[0] == 0 for _ in range(6))
    wait, paused = gates.take("paced")
    assert 0 < wait <= 10 and not paused
    assert gates.take("installation:1") == (0, False)  # another credential has a bucket of its own
    relay.post("push", push_payload())
    relay.wait_settled()
    assert _only_dispatch(relay).state == "sent"


def test_claims_stop_at_what_the_credential_may_send(database_url, fake_github):
    """Rows beyond the pacing allowance stay queued instead of being claimed and put back."""
    from relay.dispatch.dispatcher import Dispatcher
    from relay.github import GitHubClient
    from relay.store import Store
    from tests.relay.helpers import new_delivery, new_dispatches

    store = Store(database_url)
    store.migrate()
    dispatcher = Dispatcher(store, GitHubClient(fake_github.url, token="test-token"), requests_per_minute=3)
    try:
        store.record_delivery(new_delivery("first"), new_dispatches("first", ["a"]))
        [first] = dispatcher.claim_once()
        dispatcher._send(first)  # the worker's entry point: teaches the credential, spends one of 3 calls
        assert dispatcher.gates.allowance("token") == 2
        store.record_delivery(new_delivery("burst"), new_dispatches("burst", ["a", "b", "c", "d"]))
        claimed = dispatcher.claim_once()
        assert [row.backend for row in claimed] == ["a", "b"]
        assert {d.backend: d.state for d in store.dispatches("burst")} == {
            "a": "sending", "b": "sending", "c": "queued", "d": "queued"}
        assert all(d.last_error is None for d in store.dispatches())  # nothing was put back
    finally:
        store.close()


def test_no_claims_spin_while_every_due_row_waits_for_a_resting_credential(relay_factory, database_url, one_backend, wait):
    # The poll is longer than the rest, so inside the rest only wakes may bring the loop out: the
    # rest's end is in its wait, and a loop that claims again and again for rows it may not send shows
    # as empty claims piling up in the window (before the fix, about 5 a second).
    poll = 30.0
    relay = relay_factory(database_url, dispatch_poll_seconds=poll)
    relay.fake.script(Fault.rate_limited(retry_after=3))
    for index in range(4):
        relay.post("push", push_payload(after=f"{index}" * 40))
    wait(lambda: any(r.answered == 429 for r in relay.fake.requests), what="the 429")
    claims = relay.parts.metrics.claims
    before = claims.labels("empty")._value.get()
    resting_since = time.monotonic()
    wait(lambda: len(relay.fake.requests) >= 2, timeout=60, what="the first send after the rest")
    rested = time.monotonic() - resting_since
    empty_claims = claims.labels("empty")._value.get() - before
    # Wakes that may still land in the window: the 429's send finishing (1) and the later webhooks'
    # intake wakes (3), plus one spare; no poll falls inside unless the window outlasts it.
    assert empty_claims <= int(rested / poll) + 1 + 3 + 1, (empty_claims, rested)
    relay.wait_settled()
    assert [r.state for r in relay.store.dispatches()] == ["sent"] * 4


def test_a_stored_webhook_wakes_the_dispatcher_of_its_own_process(relay_factory, database_url, one_backend, wait):
    # The poll is an hour: only intake's wake can bring the dispatch out (other processes' rows are
    # found by polling; this process's are sent as soon as they are committed).
    relay = relay_factory(database_url, dispatch_poll_seconds=3600)
    wait(lambda: relay.parts.metrics.claims.labels("empty")._value.get() >= 1, what="the dispatcher's first pass")
    for index in range(3):  # each webhook once the dispatcher is idle again
        relay.post("push", push_payload(after=f"{index + 1}" * 40))
        wait(lambda: len(relay.fake.dispatches()) == index + 1, timeout=30, what=f"dispatch {index + 1}")
    relay.wait_settled()
    assert [r.state for r in relay.store.dispatches()] == ["sent"] * 3
