"""Group commit: one writer thread per store commits every pending intake write in one transaction.

Triggered by ``Store.submit_delivery`` (intake, once per webhook; ``Store.record_delivery`` waits on it).
Reads the queue of pending writes; writes through the batch function the store hands it (which runs one
transaction for the whole batch) and then resolves each caller's future with its own outcome.

Why: a durable commit costs the same whether it carries one webhook or fifty (an fsync on PostgreSQL,
SQLite's single write lock plus a WAL append). Committing per request made 32 concurrent webhooks queue
behind each other's commits; here they share one. Nothing waits on purpose: the writer takes whatever is
pending the moment the previous commit ends, so a lone webhook commits at once and a burst batches itself.
A caller's future resolves only after the transaction holding its rows has committed, so the answer to
GitHub still follows the durable write.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["GroupCommitter", "WriterClosed"]

log = logging.getLogger("relay.store")

Item = TypeVar("Item")
# One outcome per item, in order: a result, or the exception that item's caller should see.
BatchWriter = Callable[[Sequence[Item]], Sequence[Any]]


class WriterClosed(RuntimeError):
    """The store was closed: nothing more is written."""


class GroupCommitter(Generic[Item]):
    """GroupCommitter(write_batch, max_batch): ``submit(item)`` -> a future of that item's outcome.

    ``write_batch(items)`` runs on the writer thread, one transaction per call, and returns one outcome
    per item (a value, or an exception instance to raise in that caller). An exception escaping it fails
    every item of the batch with that exception.
    """

    def __init__(self, write_batch: BatchWriter, *, max_batch: int = 256, name: str = "relay-store-writer"):
        self._write_batch = write_batch
        self._max_batch = max_batch
        self._name = name
        self._pending: list[tuple[Item, concurrent.futures.Future]] = []
        self._ready = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, item: Item) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._ready:
            if self._closed:
                raise WriterClosed("the store is closed")
            self._pending.append((item, future))
            if self._thread is None:
                # Started on first use: a Store built only to read or migrate never has the thread.
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._ready.notify()
        return future

    def close(self) -> None:
        """Write what is pending, then stop the thread; later submits raise :class:`WriterClosed`."""
        with self._ready:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return  # closed and drained
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
            # A caller that gave up (its request was cancelled) gets nothing written; the others'
            # futures can no longer be cancelled from here on, so each will hear its outcome.
            batch = [(item, future) for item, future in batch if future.set_running_or_notify_cancel()]
            if batch:
                self._commit(batch)

    def _commit(self, batch: list[tuple[Item, concurrent.futures.Future]]) -> None:
        try:
            outcomes = self._write_batch([item for item, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"batch writer returned {len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # noqa: BLE001 - every caller must hear back, whatever went wrong
            if not isinstance(exc, Exception):
                log.error("store writer interrupted", exc_info=True)
            outcomes = [exc] * len(batch)
        for (_, future), outcome in zip(batch, outcomes):
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
