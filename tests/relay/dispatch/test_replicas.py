"""Per-backend and per-credential guarantees hold across relay processes on one database: one call in
flight per backend (so its order is kept), and rate-limit rests and pacing budgets shared by every
process that uses the credential."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from pathlib import Path

import pytest

from relay.store import Store
from relay.testing import Fault
from tests.relay.conftest import wait_until
from tests.relay.helpers import RelayProcess, push_payload, write_backend
from tests.relay.faults.test_crash_safety import _env


@pytest.fixture
def solo_backend(tmp_path: Path) -> Path:
    folder = tmp_path / "replica-backends"
    folder.mkdir()
    write_backend(folder, "solo", "org/solo-ci", "L1")
    return folder


def _two_relays(postgres_url, fake, backends, tmp_path, **extra):
    env = _env(postgres_url, fake, backends, RELAY_DISPATCH_LEASE_SECONDS="30", RELAY_GITHUB_TIMEOUT_SECONDS="5", **extra)
    return RelayProcess(env, tmp_path / "first.log").start(), RelayProcess(env, tmp_path / "second.log").start()


def _post_alternately(relays, count: int, prefix: str) -> list[str]:
    deliveries = [f"{prefix}-{i}" for i in range(count)]
    for index, delivery in enumerate(deliveries):
        # A head of its own per delivery: the same signed body under another delivery id is a replay (200)
        head = hashlib.sha1(delivery.encode()).hexdigest()
        answer = relays[index % 2].post("push", push_payload(after=head), delivery)
        assert answer.status_code == 202, answer.text
    return deliveries


def test_two_relays_keep_one_call_in_flight_per_backend_and_its_order(postgres_url, fake_github, solo_backend, tmp_path):
    """Rows posted alternately to two processes reach GitHub one call at a time, in the order they came.

    The property only means something when both processes sent rows. Which one claims the next row after a
    call is answered is a race (the process that sent the last one is already awake), and on a loaded
    machine one of them can win all 16: such a round still has its order checked, and another round is run,
    three at most."""
    fake_github.latency = 0.03
    relays = _two_relays(postgres_url, fake_github, solo_backend, tmp_path)
    claimers_per_round = []
    try:
        for round_ in range(3):
            deliveries = _post_alternately(relays, 16, f"lane{round_}")
            wait_until(lambda: len(_calls_of(fake_github, deliveries)) == len(deliveries), timeout=60,
                       what="every row sent")
            store = Store(postgres_url)
            claimers = {row.claimed_by for row in store.dispatches() if row.delivery_id in deliveries}
            store.close()
            calls = _calls_of(fake_github, deliveries)
            # The next call of the backend arrives only after the previous one was answered.
            overlaps = [(a.json["client_payload"]["delivery"], b.json["client_payload"]["delivery"])
                        for a, b in zip(calls, calls[1:]) if b.arrived_at < a.received_at]
            assert overlaps == []
            assert [c.json["client_payload"]["delivery"] for c in calls] == deliveries  # arrival order, across both
            claimers_per_round.append(len(claimers))
            if len(claimers) == 2:  # both processes sent rows
                break
    finally:
        for relay in relays:
            relay.stop()
    assert claimers_per_round[-1] == 2, (
        f"one process claimed every row in each of {len(claimers_per_round)} rounds: the order across processes "
        "was never exercised")


def _calls_of(fake, deliveries: list[str]) -> list:
    """The dispatches of ``deliveries`` that reached the fake GitHub, in the order they arrived."""
    wanted = set(deliveries)
    return sorted((r for r in fake.requests
                   if r.endpoint == "dispatches" and r.json["client_payload"]["delivery"] in wanted),
                  key=lambda r: r.arrived_at)


def test_two_relays_share_a_credentials_rate_limit_rest(postgres_url, fake_github, tmp_path):
    folder = tmp_path / "rest-backends"
    folder.mkdir()
    for name in ("p", "q"):
        write_backend(folder, name, f"org/{name}-ci", "L1")
    relays = _two_relays(postgres_url, fake_github, folder, tmp_path)
    try:
        fake_github.script(Fault.rate_limited(retry_after=1.5))
        _post_alternately(relays, 6, "rest")
        wait_until(lambda: len(fake_github.dispatches()) == 12, timeout=60, what="every row sent")
        store = Store(postgres_url)
        try:
            (gate,) = store.credential_gates()  # the only credential
        finally:
            store.close()
    finally:
        for relay in relays:
            relay.stop()
    calls = [r for r in fake_github.requests if r.endpoint == "dispatches"]
    limited = next(r for r in calls if r.answered == 429)
    # The rest runs from when the relay that got the 429 recorded it (the 1.5 s GitHub asked for) until
    # ``resting_until``; before it is recorded, calls of the other backend may go on (how long the relay takes
    # to record it depends on the machine's load).
    rest_ends = gate.resting_until.replace(tzinfo=dt.timezone.utc).timestamp()
    rest_starts = rest_ends - 1.5
    assert limited.received_at < rest_starts, (limited.received_at, rest_starts)  # the rest this 429 ordered
    during_rest = [r for r in calls if rest_starts < r.arrived_at < rest_ends - 0.05]
    # Neither process calls with that token while it rests (it is the only credential): the one call
    # that may arrive is the other backend's, already on its way when the rest was recorded.
    assert len(during_rest) <= 1, [(r.repository, r.arrived_at - rest_starts) for r in during_rest]
    assert len([r for r in calls if r.answered == 204]) == 12


def test_two_relays_share_a_credentials_pacing_budget(postgres_url, fake_github, tmp_path):
    folder = tmp_path / "budget-backends"
    folder.mkdir()
    for name in ("p", "q", "r", "s"):
        write_backend(folder, name, f"org/{name}-ci", "L1")
    # A bucket of 6 calls, refilled at one per 10 s: both processes together may make 6 calls now.
    relays = _two_relays(postgres_url, fake_github, folder, tmp_path, RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE="6")
    try:
        _post_alternately(relays, 6, "budget")  # 24 rows, 12 in each process's reach
        wait_until(lambda: len(fake_github.dispatches()) >= 6, timeout=30, what="the first 6 calls")
        time.sleep(1.5)  # far below the 10 s the bucket needs for one more call: any further call is a second budget
        sent = len(fake_github.dispatches())
    finally:
        for relay in relays:
            relay.stop()
    assert sent == 6
