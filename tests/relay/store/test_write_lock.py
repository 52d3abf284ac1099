"""The SQLite write lock puts bulk writes (a big report's chunks) behind every other waiting write, for
a bounded time, and never lets two writers in at once."""

from __future__ import annotations

import threading
import time

from relay.store.write_lock import WriteLock


def _waiter(lock: WriteLock, name: str, order: list[str], *, bulk: bool, ready: threading.Event | None = None):
    def run():
        if ready is not None:
            ready.set()
        assert lock.acquire(10, bulk=bulk)
        order.append(name)
        time.sleep(0.02)
        lock.release()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_waiting_writes_go_before_a_waiting_bulk_write_whatever_came_first():
    lock, order = WriteLock(yield_seconds=5), []
    assert lock.acquire(1)  # a write in progress
    bulk = _waiter(lock, "chunk", order, bulk=True)
    time.sleep(0.05)  # the chunk waits first
    intake = [_waiter(lock, f"webhook-{i}", order, bulk=False) for i in range(3)]
    time.sleep(0.05)
    lock.release()
    for thread in (bulk, *intake):
        thread.join(10)
    assert order[-1] == "chunk" and sorted(order[:-1]) == ["webhook-0", "webhook-1", "webhook-2"]


def test_a_bulk_write_yields_for_a_bounded_time_only_and_the_timeout_holds():
    lock = WriteLock(yield_seconds=0.2)
    lock._others_waiting = 1  # a writer that waits for ever (say, a stuck thread) must not starve the chunk
    started = time.monotonic()
    assert lock.acquire(5, bulk=True)
    assert 0.2 <= time.monotonic() - started < 2
    assert not lock.acquire(0.1)  # held: a second writer times out
    lock.release()
    assert lock.acquire(0.1)


def test_one_writer_at_a_time():
    lock, inside, most = WriteLock(yield_seconds=0.05), [0], [0]

    def write(bulk: bool):
        for _ in range(50):
            assert lock.acquire(10, bulk=bulk)
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            inside[0] -= 1
            lock.release()

    threads = [threading.Thread(target=write, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most[0] == 1
