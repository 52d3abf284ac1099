"""Durability across processes: kill -9 while dispatches are queued and in flight loses nothing, and two
relay processes on one PostgreSQL never send the same outbox row twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relay.store import Store
from relay.testing import Fault
from relay.testing import loopback_client
from tests.relay.conftest import wait_until
from tests.relay.helpers import SECRET, RelayProcess, push_payload, write_backend

GITHUB_TOKEN = "ghp_crash_test_token"


def _env(database_url: str, fake, backends: Path, **extra: str) -> dict[str, str]:
    fake.tokens.add(GITHUB_TOKEN)
    return {
        "RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_TOKEN": GITHUB_TOKEN, "RELAY_GITHUB_API_URL": fake.url,
        "RELAY_DATABASE_URL": database_url, "RELAY_BACKENDS_DIR": str(backends), "RELAY_UPSTREAM_REPO": "pytorch/pytorch",
        "RELAY_DISPATCH_POLL_SECONDS": "0.05", "RELAY_DISPATCH_BACKOFF_BASE_SECONDS": "0.05",
        "RELAY_DISPATCH_BACKOFF_MAX_SECONDS": "0.2", "RELAY_GITHUB_TIMEOUT_SECONDS": "0.5",
        "RELAY_DISPATCH_LEASE_SECONDS": "1.5", "RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0", **extra,
    }


@pytest.fixture
def three_backends(tmp_path: Path) -> Path:
    folder = tmp_path / "crash-backends"
    folder.mkdir()
    for name in ("x", "y", "z"):
        write_backend(folder, name, f"org/{name}-ci", "L2")
    return folder


def _wait_all_sent(store: Store, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = store.dispatches()
        if len(rows) == expected and all(r.state == "sent" for r in rows):
            return
        if time.monotonic() > deadline:
            states = {}
            for r in rows:
                states[r.state] = states.get(r.state, 0) + 1
            raise AssertionError(f"not all {expected} dispatches sent after {timeout}s: {states}")
        time.sleep(0.05)


def test_kill_9_with_queued_and_in_flight_dispatches_loses_nothing(database_url, fake_github, three_backends, tmp_path):
    fake_github.latency = 0.15  # each lane sends one row per 0.15 s: the outbox is still full when we kill
    log = tmp_path / "relay.log"
    relay = RelayProcess(_env(database_url, fake_github, three_backends), log).start()
    deliveries = [f"crash-{i}" for i in range(12)]
    try:
        for index, delivery in enumerate(deliveries):
            assert relay.post("push", push_payload(after=f"{index:040d}"), delivery).status_code == 202
        store = Store(database_url)
        deadline = time.monotonic() + 20
        while store.outbox_depth()["sent"] < 3 and not store.outbox_depth()["failed"] and time.monotonic() < deadline:
            time.sleep(0.02)
        relay.kill()
        depth = store.outbox_depth()
        in_flight = depth["sending"]
        assert depth["queued"] > 0 and depth["sent"] >= 3, depth  # killed mid-way, with work outstanding
    finally:
        relay.stop()

    restarted = RelayProcess(_env(database_url, fake_github, three_backends), log).start()
    try:
        _wait_all_sent(store, expected=len(deliveries) * 3)
    finally:
        restarted.stop()
    accepted = [(d["client_payload"]["delivery"], r) for r in ("org/x-ci", "org/y-ci", "org/z-ci")
                for d in fake_github.dispatches(r)]
    expected = {(delivery, repo) for delivery in deliveries for repo in ("org/x-ci", "org/y-ci", "org/z-ci")}
    assert set(accepted) == expected
    text = log.read_text()
    # At-least-once: only a call whose answer the relay never saw can have been repeated: one in flight at
    # the kill (at most one per lane), or one that timed out waiting for the answer on a busy machine
    # (GitHub, here the fake, may have taken it) and was sent again, as the log says.
    unanswered = text.count("network error: ReadTimeout") + text.count("claim lost before its outcome was recorded")
    assert len(accepted) - len(expected) <= max(in_flight, 3) + unanswered
    assert GITHUB_TOKEN not in text and SECRET not in text
    store.close()


def test_a_process_killed_mid_send_has_its_rows_sent_by_the_next_long_before_their_lease_ends(
        database_url, fake_github, three_backends, tmp_path):
    env = _env(database_url, fake_github, three_backends, RELAY_DISPATCH_LEASE_SECONDS="600",
               RELAY_GITHUB_TIMEOUT_SECONDS="30")
    fake_github.latency = 20  # every call hangs: the first process dies with a claim on each lane
    first = RelayProcess(env, tmp_path / "first.log").start()
    store = Store(database_url)
    try:
        assert first.post("push", push_payload(), "mid-send").status_code == 202
        wait_until(lambda: store.outbox_depth()["sending"] == 3, timeout=20, what="a call in flight per backend")
        first.kill()
    finally:
        first.stop()
    fake_github.latency = 0
    second = RelayProcess(env, tmp_path / "second.log").start()
    started = time.monotonic()
    try:
        _wait_all_sent(store, expected=3, timeout=60)  # not after the 600 s lease
    finally:
        second.stop()
        store.close()
    assert time.monotonic() - started < 60
    assert "claims of a dead process ended" in (tmp_path / "second.log").read_text()


def test_two_processes_on_one_postgresql_never_send_a_row_twice(postgres_url, fake_github, tmp_path):
    backends = tmp_path / "many-backends"
    backends.mkdir()
    names = [f"b{i}" for i in range(6)]
    for name in names:
        write_backend(backends, name, f"org/{name}-ci", "L1")
    fake_github.latency = 0.01
    env = _env(postgres_url, fake_github, backends, RELAY_DISPATCH_LEASE_SECONDS="30", RELAY_GITHUB_TIMEOUT_SECONDS="5")
    first = RelayProcess(env, tmp_path / "first.log").start()
    second = RelayProcess(env, tmp_path / "second.log").start()
    try:
        deliveries = [f"shared-{i}" for i in range(24)]
        for index, delivery in enumerate(deliveries):
            relay = first if index % 2 == 0 else second
            assert relay.post("push", push_payload(after=f"{index:040d}"), delivery).status_code == 202
        store = Store(postgres_url)
        _wait_all_sent(store, expected=len(deliveries) * len(names))
        claimers = {row.claimed_by for row in store.dispatches()}
        store.close()
    finally:
        first.stop()
        second.stop()
    nonces = [d["client_payload"]["nonce"] for d in fake_github.dispatches()]
    assert len(nonces) == len(set(nonces)) == len(deliveries) * len(names)
    assert len(claimers) == 2  # both processes sent rows


def test_kill_9_with_reports_pending_reports_them_all_after_restart(database_url, fake_github, tmp_path):
    """Reporting finds its work in the store: a relay killed while its reporter hangs on GitHub, with a
    push run and a PR run finished but not reported, reports both (final states) once restarted."""

    from tests.relay.helpers import pr_payload
    from tests.relay.results_support import TOKENS, write_backends

    backends = write_backends(tmp_path / "report-backends")
    # The first commit status the relay writes hangs, and with it the reporter; everything after it waits.
    fake_github.script(Fault.slow(600), endpoint="statuses")
    env = _env(database_url, fake_github, backends, RELAY_GITHUB_TIMEOUT_SECONDS="120",
               RELAY_DISPATCH_LEASE_SECONDS="300", RELAY_SWEEPER_ENABLED="false", RELAY_REPORTING_POLL_SECONDS="0.1")
    log = tmp_path / "relay.log"
    relay = RelayProcess(env, log).start()
    push_sha, pr_sha = "c" * 40, "a" * 40
    try:
        assert relay.post("push", push_payload(after=push_sha), "report-push").status_code == 202
        assert relay.post("pull_request", pr_payload("opened", number=61, head_sha=pr_sha), "report-pr").status_code == 202
        nonces = _wait_for(lambda: {d["client_payload"]["delivery"]: d["client_payload"]["nonce"]
                                    for d in fake_github.dispatches("org/l4-ci")}, lambda n: len(n) == 2)
        _wait_for(lambda: fake_github.faults_left, lambda left: left == 0)  # the reporter's first write hangs
        for delivery, run_id, conclusion in (("report-push", 7001, "success"), ("report-pr", 7002, "failure")):
            for body in ({"state": "in_progress"}, {"state": "completed", "conclusion": conclusion}):
                answer = loopback_client().post(f"{relay.url}/github/callback", timeout=30, json={
                    "nonce": nonces[delivery], "run_id": run_id, "run_attempt": 1, **body,
                }, headers={"Authorization": f"Token {TOKENS['l4']}"})
                assert answer.status_code == 200, answer.text
        relay.kill()
    finally:
        relay.stop()
    store = Store(database_url)
    runs = {run.head_sha: run for run in store.runs(backend="l4")}
    assert {sha: runs[sha].state for sha in (push_sha, pr_sha)} == {push_sha: "completed", pr_sha: "completed"}
    assert [s for s in fake_github.statuses if s["state"] != "pending"] == []  # nothing final reported before the kill

    restarted = RelayProcess(env, log).start()
    try:
        finals = _wait_for(lambda: {s["sha"]: s["state"] for s in fake_github.statuses
                                    if s["context"] == "crcr/l4" and s["state"] != "pending"},
                           lambda f: len(f) == 2)
    finally:
        restarted.stop()
    assert finals == {push_sha: "success", pr_sha: "failure"}
    assert {store.reported_state(runs[sha].id, "status").state for sha in (push_sha, pr_sha)} == {
        "completed:success", "completed:failure"}


def _wait_for(read, done, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout}s waiting; last seen: {value!r}")
        time.sleep(0.05)
