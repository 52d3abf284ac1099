"""The store on SQLite and PostgreSQL: migrations, atomic intake writes, claims, leases, backends, PR labels."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from relay.store import BackendRecord, NewDispatch, PullRequestSnapshot, Store
from relay.trust import BackendTarget, TrustLevel
from relay.store.models import Base
from tests.relay.helpers import new_delivery, new_dispatches


def test_migrations_match_the_models_and_rerun_cleanly(empty_database_url):
    store = Store(empty_database_url)
    try:
        with store.engine.connect() as connection:
            assert MigrationContext.configure(connection).get_current_revision() is None  # nothing yet
        store.migrate()
        with store.engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        store.migrate()  # at every start-up: a no-op when current
    finally:
        store.close()


def test_delivery_and_dispatches_are_written_together(store):
    assert store.record_delivery(new_delivery("d1"), new_dispatches("d1"))
    assert store.record_delivery(new_delivery("d1"), new_dispatches("d1")) is False
    assert [(d.backend, d.state, d.attempts) for d in store.dispatches()] == [("a", "queued", 0), ("b", "queued", 0)]


def test_a_failed_write_leaves_nothing_behind(store):
    from relay.store import StoreRefused

    store.record_delivery(new_delivery("d1"), new_dispatches("d1"))
    # The second delivery reuses a nonce: its dispatch insert fails, and so must its delivery row.
    clash = [NewDispatch(backend="a", repository="org/a", event_type="push", client_payload={}, nonce="d1-a")]
    with pytest.raises(StoreRefused, match="delivery d2: the database refused its rows"):
        store.record_delivery(new_delivery("d2"), clash)
    assert store.delivery("d2") is None
    assert len(store.dispatches()) == 2


def test_claim_takes_the_oldest_row_per_backend(store):
    store.record_delivery(new_delivery("d1"), new_dispatches("d1"))
    store.record_delivery(new_delivery("d2"), new_dispatches("d2"))
    claimed = store.claim_dispatches("p1", limit=10, lease_seconds=30)
    assert sorted((c.delivery_id, c.backend) for c in claimed) == [("d1", "a"), ("d1", "b")]
    assert store.claim_dispatches("p1", limit=10, lease_seconds=30, exclude_backends={"a", "b"}) == []
    # While d1's rows are out, no process may claim d2's: one call in flight per backend keeps its order.
    assert store.claim_dispatches("p2", limit=10, lease_seconds=30) == []
    first_a = next(c for c in claimed if c.backend == "a")
    assert store.finish_dispatch(first_a.id, "p1", state="sent", attempted=True, last_status=204)
    again = store.claim_dispatches("p2", limit=10, lease_seconds=30)
    assert [(c.delivery_id, c.backend) for c in again] == [("d2", "a")]


def test_outcome_needs_the_claim(store):
    store.record_delivery(new_delivery("d1"), new_dispatches("d1", ["a"]))
    [row] = store.claim_dispatches("p1", limit=10, lease_seconds=30)
    assert store.finish_dispatch(row.id, "someone-else", state="sent", attempted=True) is False
    assert store.finish_dispatch(row.id, "p1", state="sent", attempted=True, last_status=204) is True
    [view] = store.dispatches()
    assert (view.state, view.attempts, view.claimed_by, view.last_status) == ("sent", 1, "p1", 204)
    assert view.sent_at is not None and view.sent_at >= view.created_at


def test_expired_lease_is_claimed_again(store):
    store.record_delivery(new_delivery("d1"), new_dispatches("d1", ["a"]))
    # The lease is long enough that a loaded machine cannot expire it before the second claim.
    [row] = store.claim_dispatches("dead-process", limit=10, lease_seconds=1.0)
    assert store.claim_dispatches("p2", limit=10, lease_seconds=30) == []
    time.sleep(1.1)
    [again] = store.claim_dispatches("p2", limit=10, lease_seconds=30)
    assert again.id == row.id
    assert store.finish_dispatch(row.id, "dead-process", state="sent", attempted=True) is False
    assert store.finish_dispatch(row.id, "p2", state="sent", attempted=True) is True


def test_retry_is_not_claimable_before_it_is_due(store):
    store.record_delivery(new_delivery("d1"), new_dispatches("d1", ["a"]))
    [row] = store.claim_dispatches("p1", limit=10, lease_seconds=30)
    store.finish_dispatch(row.id, "p1", state="queued", attempted=True, last_error="502", retry_in_seconds=1.0)
    assert store.claim_dispatches("p1", limit=10, lease_seconds=30) == []
    assert 0 < store.seconds_until_next_due() <= 1.0
    time.sleep(1.05)
    assert [c.attempts for c in store.claim_dispatches("p1", limit=10, lease_seconds=30)] == [1]


def test_outbox_depth_counts_states(store):
    store.record_delivery(new_delivery("d1"), new_dispatches("d1", ["a", "b", "c"]))
    claimed = store.claim_dispatches("p1", limit=10, lease_seconds=30, max_claims=2)
    store.finish_dispatch(claimed[0].id, "p1", state="failed", attempted=True, last_error="404")
    assert store.outbox_depth() == {"queued": 1, "sending": 1, "sent": 0, "failed": 1}


def test_backends_sync_marks_removed_ones_inactive(store):
    store.sync_backends([BackendTarget("a", "org/a", TrustLevel.L1, "ciflow/crcr/a"),
                         BackendTarget("b", "org/b", TrustLevel.L3, "x")])
    assert store.sync_backends([BackendTarget("b", "org/b2", TrustLevel.L4, "x")]) == {"b": ("L3", "L4")}
    a, b = store.backends()
    assert a == BackendRecord("a", "org/a", "L1", "ciflow/crcr/a", active=False)
    assert b.level_changed_at is not None  # the level's version moved on
    assert b == BackendRecord("b", "org/b2", "L4", "x", active=True, level_changed_at=b.level_changed_at)


def test_pull_request_labels_newest_snapshot_wins(store):
    def snap(labels, at):
        return PullRequestSnapshot("pytorch/pytorch", 5, "a" * 40, "open", labels, at)

    store.record_delivery(new_delivery("d1"), (), snap(("x",), "2024-01-01T00:00:02Z"))
    store.record_delivery(new_delivery("d2"), (), snap(("x", "y"), "2024-01-01T00:00:01Z"))
    assert store.pull_request_labels("pytorch/pytorch", 5) == ("x",)
    store.record_delivery(new_delivery("d3"), (), snap((), "2024-01-01T00:00:03Z"))
    assert store.pull_request_labels("pytorch/pytorch", 5) == ()
    assert store.pull_request_labels("pytorch/pytorch", 6) is None


def test_concurrent_claimers_never_share_a_row(database_url):
    """Many claimers on one database (SKIP LOCKED on PostgreSQL, BEGIN IMMEDIATE on SQLite)."""
    # Eight threads hammering one file on a loaded machine: the deadline is not what this test is about.
    stores = [Store(database_url, deadline_seconds=60) for _ in range(4)]
    stores[0].migrate()
    backends = [f"b{i}" for i in range(10)]
    for index in range(20):
        stores[0].record_delivery(new_delivery(f"d{index}"), new_dispatches(f"d{index}", backends))

    def drain(args):
        store, name = args
        mine = []
        while True:
            rows = store.claim_dispatches(name, limit=8, lease_seconds=60, max_claims=3)
            if not rows:
                if store.outbox_depth()["queued"] == 0:
                    return mine
                time.sleep(0.002)  # every due backend has a call in flight elsewhere: let it finish
                continue
            for row in rows:
                assert store.finish_dispatch(row.id, name, state="sent", attempted=True)
                mine.append(row.id)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(drain, [(stores[i % 4], f"claimer-{i}") for i in range(8)]))
    every = [row for result in results for row in result]
    assert len(every) == len(set(every)) == 200
    assert sum(1 for result in results if result) >= 2
    for store in stores:
        store.close()


@pytest.mark.parametrize("first", ["callback", "sent"])
def test_a_run_that_calls_back_before_its_dispatch_is_marked_sent_is_still_one_run(store, first):
    """GitHub accepts the dispatch, the downstream run starts and calls back, and only then does the dispatcher
    mark the dispatch sent: the callback made the run's row, and marking it sent must not add a second one (a
    ``dispatched`` run that never starts, timed out later as if the backend never ran)."""
    from relay.store import NewDispatch
    from relay.store.results_operations import CallbackUpdate
    from relay.store.run_states import RunState

    payload = {"event": "push", "repository": "pytorch/pytorch", "head": {"sha": "c" * 40, "ref": "main"}}
    store.record_delivery(new_delivery("d1"), [NewDispatch(backend="a", repository="org/a", event_type="push",
                                                           client_payload=payload, nonce="d1-a")])
    (row,) = store.claim_dispatches("p1", limit=10, lease_seconds=30)
    started = CallbackUpdate(dispatch_id=row.id, run_id=5001, run_attempt=1, target=RunState.in_progress)
    if first == "sent":
        assert store.finish_dispatch(row.id, "p1", state="sent", attempted=True, last_status=204)
    store.apply_callback(started)
    if first == "callback":
        assert store.finish_dispatch(row.id, "p1", state="sent", attempted=True, last_status=204)
    runs = store.runs(backend="a")
    assert [(run.run_id, run.state) for run in runs] == [(5001, "in_progress")], runs


def test_stores_migrating_one_empty_database_at_once_take_turns(empty_database_url):
    """Relay processes started together on a new database all run the migrations at start: on PostgreSQL
    they take turns (an advisory lock), and each ends with the schema at the newest revision."""
    if empty_database_url.startswith("sqlite"):
        pytest.skip("with SQLite the relay runs as one process (docs/running-the-relay.md): nothing to take turns with")
    stores = [Store(empty_database_url, deadline_seconds=60) for _ in range(4)]
    try:
        with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
            list(pool.map(lambda store: store.migrate(), stores))
        with stores[0].engine.connect() as connection:
            context = MigrationContext.configure(connection)
            assert context.get_current_revision() is not None
            assert compare_metadata(context, Base.metadata) == []
    finally:
        for store in stores:
            store.close()
