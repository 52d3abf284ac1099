"""This process's SQLite write lock, with bulk writes behind the rest: a big report's chunks wait while
any other write waits (intake above all), so a webhook waits for at most the one write in progress,
never for a queue of chunks from several big reports.

Taken by ``Store._write_lock`` around every SQLite transaction (SQLite has one writer at a time, and
queueing this process's threads on a lock is fair and prompt where its busy handler sleeps and retries).
A bulk writer that has yielded for ``yield_seconds`` takes its turn like any other, so a steady stream
of webhooks cannot starve a report. PostgreSQL needs none of this: its writers do not block each other.
"""

from __future__ import annotations

import threading
import time

__all__ = ["WriteLock"]


class WriteLock:
    """WriteLock(yield_seconds): ``acquire(timeout, bulk=False)`` -> bool, ``release()``."""

    def __init__(self, yield_seconds: float):
        self.yield_seconds = yield_seconds
        self._changed = threading.Condition(threading.Lock())
        self._held = False
        self._others_waiting = 0  # writers that are not bulk, waiting for the lock

    def acquire(self, timeout: float, *, bulk: bool = False) -> bool:
        """Wait up to ``timeout`` seconds for the lock; a bulk writer also lets every other waiting
        writer go first, for up to ``yield_seconds``."""
        now = time.monotonic()
        deadline, yields_until = now + timeout, now + self.yield_seconds
        with self._changed:
            if not bulk:
                self._others_waiting += 1
            try:
                while True:
                    now = time.monotonic()
                    yielding = bulk and self._others_waiting > 0 and now < yields_until
                    if not self._held and not yielding:
                        self._held = True
                        return True
                    if now >= deadline:
                        return False
                    self._changed.wait(max((min(deadline, yields_until) if yielding else deadline) - now, 0.001))
            finally:
                if not bulk:
                    self._others_waiting -= 1

    def release(self) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()
