"""The level watch and the proposals pass run in one relay process at a time across the replicas on one
store (a lease row per worker): two ``relay serve`` processes on one PostgreSQL record one hold and open
one pull request per backend, and log no failed proposal. Below that, the lease itself on both stores.

``RELAY_REPLICA_SECONDS`` sets how long both relays run their passes once the demotion is proposed
(default 3, some 15 passes of each worker in each; the long run uses 60)."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time

import pytest

from relay.store import Store
from relay.store.base import utcnow
from tests.relay.conftest import wait_until
from tests.relay.faults.test_crash_safety import _env
from tests.relay.helpers import RelayProcess
from tests.relay.levels.test_proposals import DESCRIPTOR, DESCRIPTORS
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401


def test_a_lease_has_one_holder_who_renews_it_and_another_takes_it_when_it_ends_or_is_handed_back(store):
    t0 = utcnow()
    at = lambda seconds: t0 + dt.timedelta(seconds=seconds)  # noqa: E731
    assert store.take_worker_lease("proposals", "a", 60, now=at(0))
    assert not store.take_worker_lease("proposals", "b", 60, now=at(1))
    assert store.take_worker_lease("proposals", "a", 60, now=at(30))  # renewed: now until 90
    assert not store.take_worker_lease("proposals", "b", 60, now=at(80))
    assert store.take_worker_lease("proposals", "b", 60, now=at(91))  # a's lease ended unrenewed
    assert not store.take_worker_lease("proposals", "a", 60, now=at(92))
    store.release_worker_lease("proposals", "a")  # a holds nothing now: b's lease stays
    assert not store.take_worker_lease("proposals", "a", 60, now=at(93))
    store.release_worker_lease("proposals", "b")
    assert store.take_worker_lease("proposals", "a", 60, now=at(94))  # handed back: taken at once
    assert store.take_worker_lease("level-watch", "b", 60, now=at(94))  # a lease per worker
    assert [(v.worker, v.holder) for v in store.worker_leases()] == [("level-watch", "b"), ("proposals", "a")]


@pytest.mark.postgres
def test_processes_that_race_for_a_lease_get_it_once(postgres_url):
    stores = [Store(postgres_url) for _ in range(4)]
    stores[0].migrate()
    try:
        for round_ in range(10):
            start, taken = threading.Barrier(len(stores)), []
            now = utcnow()

            def take(store, holder):
                start.wait()
                taken.append(store.take_worker_lease(f"worker-{round_}", holder, 60, now=now))

            threads = [threading.Thread(target=take, args=(s, f"holder-{i}")) for i, s in enumerate(stores)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert sorted(taken) == [False, False, False, True], f"round {round_}: {taken}"
    finally:
        for store in stores:
            store.close()


def _log_lines(relay: RelayProcess) -> list[dict]:
    lines = []
    for line in relay.log_path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # uvicorn's own lines
    return lines


def _at(line: dict) -> dt.datetime:
    return dt.datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.postgres
def test_two_relays_hold_a_backend_once_and_propose_its_demotion_once(postgres_url, results_relay, fake_github,  # noqa: F811
                                                                       results_backends, tmp_path):  # noqa: F811
    seeding, drive = results_relay(postgres_url)
    for number in range(80, 86):  # l4: six failures -> below its L4 bar, and a demotion to propose
        nonce = drive.nonce("l4", drive.open_pr(number))
        assert drive.start("l4", nonce).status_code == 200
        assert drive.complete("l4", nonce, "failure").status_code == 200
    seeding.stop()
    fake_github.add_file(DESCRIPTORS, "backends/l4.yaml", DESCRIPTOR)
    env = _env(postgres_url, fake_github, results_backends, RELAY_LEVEL_WATCH_SECONDS="0.2",
               RELAY_PROPOSALS_REPOSITORY=DESCRIPTORS, RELAY_PROPOSALS_INTERVAL_SECONDS="0.2",
               RELAY_PROPOSALS_DEMOTE_AFTER_SECONDS="0.001", RELAY_LOG_LEVEL="INFO")
    relays = [RelayProcess(env, tmp_path / f"relay-{i}.log").start() for i in range(2)]
    try:
        wait_until(lambda: fake_github.pull_requests(DESCRIPTORS), timeout=60, what="the demotion proposed")
        time.sleep(float(os.environ.get("RELAY_REPLICA_SECONDS", "3")))  # passes every 0.2 s in each process
        stopping = utcnow()  # from here the first to stop hands its leases to the other
    finally:
        for relay in relays:
            relay.stop()
    store = Store(postgres_url)
    try:
        holds = store.level_holds("l4")
    finally:
        store.close()
    assert len(holds) == 1 and holds[0].level == "L4"
    assert [p["title"] for p in fake_github.pull_requests(DESCRIPTORS)] == ["l4: demote from L4 to L3"]
    assert [r.path for r in fake_github.requests if r.answered == 422] == []  # no "Reference already exists"
    logs = [_log_lines(relay) for relay in relays]
    errors = [line["msg"] for lines in logs for line in lines if line["level"] in ("error", "critical")]
    assert errors == []
    for worker in ("level-watch", "proposals"):
        took = [i for i, lines in enumerate(logs) for line in lines
                if line["msg"] == f"{worker}: took the lease across replicas" and _at(line) < stopping]
        assert len(took) == 1, f"{worker}: taken by processes {took}"  # one holder until the stop, no handover
