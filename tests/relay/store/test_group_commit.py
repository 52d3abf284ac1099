"""Intake's group commit on SQLite and PostgreSQL: many webhooks per transaction, each with its own outcome.

Webhooks are submitted back to back without waiting, so the writer thread finds several pending and
commits them together; every outcome asserted here must hold however the submissions were split.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from relay.store import PullRequestSnapshot, Store, StoreRefused, StoreUnavailable
from tests.relay.helpers import new_delivery, new_dispatches


def test_first_copy_wins_and_later_copies_are_duplicates(store):
    ids = ["d1", "d2", "d1", "d3", "d2", "d1"]
    futures = [store.submit_delivery(new_delivery(i), new_dispatches(i)) for i in ids]
    assert [f.result(timeout=30) for f in futures] == [True, True, False, True, False, False]
    assert sorted((d.delivery_id, d.backend) for d in store.dispatches()) == [
        ("d1", "a"), ("d1", "b"), ("d2", "a"), ("d2", "b"), ("d3", "a"), ("d3", "b")]
    # Outbox ids follow submission order, so each backend's lane sends in arrival order.
    assert [d.delivery_id for d in store.dispatches() if d.backend == "a"] == ["d1", "d2", "d3"]


def test_a_webhook_breaking_a_constraint_fails_alone(store):
    futures = [
        store.submit_delivery(new_delivery("ok-1"), new_dispatches("ok-1", ["a"])),
        store.submit_delivery(new_delivery("clash"), new_dispatches("clash", ["a"], nonce="ok-1-a")),  # nonce taken
        store.submit_delivery(new_delivery("ok-2"), new_dispatches("ok-2", ["a"])),
    ]
    assert futures[0].result(timeout=30) is True
    with pytest.raises(StoreRefused, match="delivery clash: the database refused its rows: .*nonce"):
        futures[1].result(timeout=30)
    assert futures[2].result(timeout=30) is True
    assert store.delivery("clash") is None
    assert sorted(d.delivery_id for d in store.dispatches()) == ["ok-1", "ok-2"]


def test_newest_pull_request_snapshot_wins_within_a_batch(store):
    def snap(labels, at):
        return PullRequestSnapshot("pytorch/pytorch", 9, "a" * 40, "open", labels, at)

    futures = [
        store.submit_delivery(new_delivery("p1"), (), snap(("new",), "2024-01-01T00:00:03Z")),
        store.submit_delivery(new_delivery("p2"), (), snap(("old",), "2024-01-01T00:00:01Z")),
        store.submit_delivery(new_delivery("p1"), (), snap(("duplicate",), "2024-01-01T00:00:09Z")),  # not applied
    ]
    assert [f.result(timeout=30) for f in futures] == [True, True, False]
    assert store.pull_request_labels("pytorch/pytorch", 9) == ("new",)


def test_many_threads_each_get_their_own_answer(store):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: store.record_delivery(new_delivery(f"t{i % 40}"), new_dispatches(f"t{i % 40}")),
                                range(120)))
    assert answers.count(True) == 40 and answers.count(False) == 80
    assert len(store.dispatches()) == 80


def test_close_commits_what_is_pending_then_refuses(database_url):
    store = Store(database_url)
    store.migrate()
    futures = [store.submit_delivery(new_delivery(f"c{i}"), new_dispatches(f"c{i}")) for i in range(20)]
    store.close()
    assert all(f.done() and f.result() is True for f in futures)
    with pytest.raises(StoreUnavailable, match="closed"):
        store.submit_delivery(new_delivery("late"), new_dispatches("late"))
    reopened = Store(database_url)
    try:
        assert len(reopened.dispatches()) == 40
    finally:
        reopened.close()


def test_a_cancelled_submission_is_skipped_and_the_writer_carries_on():
    """A request cancelled while its webhook waits (client gone, shutdown) must not stop the writer."""
    from relay.store.group_commit import GroupCommitter

    first_batch_started, release = threading.Event(), threading.Event()
    written: list[list[str]] = []

    def write_batch(items):
        first_batch_started.set()
        release.wait(10)
        written.append(list(items))
        return [f"stored {item}" for item in items]

    writer = GroupCommitter(write_batch)
    try:
        first = writer.submit("a")
        assert first_batch_started.wait(10)  # the writer is busy with "a"
        gone, kept = writer.submit("b"), writer.submit("c")
        assert gone.cancel()
        release.set()
        assert first.result(10) == "stored a" and kept.result(10) == "stored c"
        assert writer.submit("d").result(10) == "stored d"
        assert written == [["a"], ["c"], ["d"]]
    finally:
        release.set()
        writer.close()
