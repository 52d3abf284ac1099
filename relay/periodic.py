"""A background thread that runs one pass of work every few seconds until the app stops.

Every background worker of the relay runs on it: the dispatcher and the reporting worker (each asks
for its own wait after every pass, ``next_wait``), the sweeper, the re-run watcher, the level watch,
the proposer and the descriptor reload (``RunsPeriodically``). A pass that raises is logged and the next pass runs as
planned, so one bad row never stops the loop. The passes handle bad rows themselves (quarantine, see
``relay.store.quarantine``); a pass that still raises means the worker itself is failing, and after
``FAILING_AFTER`` such passes in a row :meth:`PeriodicThread.problem` says so (``/readyz`` reports it).

A worker that must run in one process at a time across replicas (the level watch, the proposer) is
given a :class:`ReplicaLease`: each pass first takes or renews the store's lease on the worker's
name, and a process that does not hold it skips the pass.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

__all__ = ["FAILING_AFTER", "PeriodicThread", "ReplicaLease", "RunsPeriodically"]

log = logging.getLogger("relay.periodic")

FAILING_AFTER = 3  # passes failed in a row before the worker counts as failing


class ReplicaLease:
    """ReplicaLease(store, worker, seconds): the lease on ``worker`` that lets one process of all those
    on ``store`` run its passes. ``seconds`` is how long a taken lease lasts unrenewed: longer than a
    pass and its interval, so the holder renews it in time; a holder that dies hands over within it."""

    def __init__(self, store, worker: str, seconds: float):
        self.store = store
        self.worker = worker
        self.seconds = seconds
        self.holder = f"{socket.gethostname()[:120]} pid {os.getpid()} {uuid.uuid4().hex[:12]}"
        self.held = False

    @classmethod
    def for_interval(cls, store, worker: str, interval: float) -> "ReplicaLease":
        """A lease that outlasts two intervals and a slow pass (a minute at least)."""
        return cls(store, worker, max(2 * interval + 30.0, 60.0))

    def take(self) -> bool:
        was_held, self.held = self.held, self.store.take_worker_lease(self.worker, self.holder, self.seconds)
        if self.held != was_held:
            log.info("%s: %s the lease across replicas", self.worker, "took" if self.held else "lost",
                     extra={"holder": self.holder})
        return self.held

    def release(self) -> None:
        if self.held:
            self.held = False
            self.store.release_worker_lease(self.worker, self.holder)


class PeriodicThread:
    """Calls ``work()`` every ``interval`` seconds (0: only when woken) on a daemon thread named ``name``;
    with ``next_wait``, the seconds to wait after each pass are asked of it instead (0: the next pass at once)."""

    def __init__(self, name: str, interval: float, work: Callable[[], object], *, first_after_interval: bool = False,
                 next_wait: Callable[[], float] | None = None, lease: ReplicaLease | None = None):
        self.name = name
        self.lease = lease  # None: every process runs the passes
        self.interval = interval
        self.work = work
        self.first_after_interval = first_after_interval  # False: the first pass runs at start
        self.next_wait = next_wait
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures_in_a_row = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.lease is not None:
            try:
                self.lease.release()  # another replica takes over at its next pass, not at the lease's end
            except Exception:  # noqa: BLE001 - a store that is down lets the lease end by itself
                log.warning("%s: could not hand back its lease; it ends within %.0f s", self.name, self.lease.seconds)

    def wake(self, _changed: object = None) -> None:
        """Run the next pass now instead of at the end of the interval. ``_changed`` (what a caller says
        changed, a run's key) is not needed: a pass reads what changed from the store. A part of another
        flow is handed this method itself, so waking a worker runs no code of the worker's flow."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """The worker was told to stop: a long pass ends early."""
        return self._stop.is_set()

    def pause(self, seconds: float) -> None:
        """At the start of a pass: wait ``seconds`` unless the worker stops first. A wake does not end it,
        and the wakes that came meanwhile are spent: the rest of the pass sees what they announced."""
        self._stop.wait(seconds)
        self._wake.clear()

    def problem(self) -> str | None:
        """None while the worker works; else a sentence naming it, its failed passes and the last error."""
        if self.failures_in_a_row < FAILING_AFTER:
            return None
        return f"{self.name}: its last {self.failures_in_a_row} passes failed; last error: {self.last_error}"

    def _loop(self) -> None:
        if self.first_after_interval:
            self._wait()
        while not self._stop.is_set():
            try:
                if self.lease is None or self.lease.take():
                    self.work()
            except Exception as exc:
                self.failures_in_a_row += 1
                self.last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                log.exception("%s: pass failed; next pass in %.1f s", self.name, self.interval)
            else:
                self.failures_in_a_row = 0
            self._wait()

    def _wait(self) -> None:
        if self._stop.is_set():  # a pause inside the pass may have spent stop()'s wake
            return
        if self.next_wait is not None:
            seconds = self.next_wait()
            if seconds > 0:
                self._wake.wait(seconds)
        else:
            self._wake.wait(self.interval if self.interval > 0 else None)  # 0: only when woken
        self._wake.clear()


class RunsPeriodically:
    """A worker whose passes run on ``self._periodic`` (a ``PeriodicThread`` its ``__init__`` sets)."""

    _periodic: PeriodicThread

    def problem(self) -> str | None:
        return self._periodic.problem()

    @property
    def wake(self) -> Callable[..., None]:
        """``wake(...)``: run the next pass now, not at the end of the poll. It is the thread's own wake
        (``PeriodicThread.wake``), handed to the parts that change what a pass reads (intake, callbacks,
        the dispatcher), so the part that wakes a worker runs none of the worker's pass itself."""
        return self._periodic.wake

    def start(self) -> None:
        self._periodic.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._periodic.stop(timeout)
