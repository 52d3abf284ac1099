"""The sweeper: a periodic pass that keeps the run records honest when callbacks never come.

Triggered every ``RELAY_SWEEP_INTERVAL_SECONDS`` by its own thread (started with the app), or once
by ``sweep_once()``. Reads runs and dispatches; writes runs and expired nonces (through
:mod:`relay.store`) and wakes reporting, which finds the runs it changed by their rows, so an upstream
check stuck at "in progress" gets its final state. (Run rows are created by the dispatcher, in the
transaction that marks a dispatch sent.)
Each action has a named reason, logged and counted (``relay_sweeper_actions_total{reason}``):

* ``never_started``: dispatched, but no ``in_progress`` within ``RELAY_RUN_START_TIMEOUT_SECONDS``
  -> ``timed_out``;
* ``ran_too_long``: ``in_progress`` for longer than ``RELAY_RUN_TIMEOUT_SECONDS`` (default 3 days)
  -> ``timed_out``;
* ``nonce_expired``: nonces of dispatches sent more than ``RELAY_NONCE_TTL_HOURS`` ago are refused
  from then on;
* ``results_discarded``: a big report's results written in chunks whose run became final without
  them (the callback crashed, or was retried and the retry won) are deleted (see
  ``relay.store.result_batches``).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from relay.periodic import PeriodicThread, RunsPeriodically
from relay.store.base import utcnow

__all__ = ["REASONS", "SweepFailed", "Sweeper"]

log = logging.getLogger("relay.sweeper")

REASONS = ("never_started", "ran_too_long", "nonce_expired", "results_discarded")


class SweepFailed(RuntimeError):
    """A step of the pass raised (the message names each step and its error); the others ran."""


class Sweeper(RunsPeriodically):
    """Sweeper(store, start_timeout_s, run_timeout_s, nonce_ttl_s, on_run_changed=None, registry=None)."""

    def __init__(
        self, store, *, start_timeout_seconds: float, run_timeout_seconds: float, nonce_ttl_seconds: float,
        interval_seconds: float = 60.0, on_run_changed: Callable[[int], None] | None = None,
        registry: CollectorRegistry | None = None, clock: Callable[[], dt.datetime] = utcnow,
    ):
        self.store = store
        self.start_timeout = dt.timedelta(seconds=start_timeout_seconds)
        self.run_timeout = dt.timedelta(seconds=run_timeout_seconds)
        self.nonce_ttl = dt.timedelta(seconds=nonce_ttl_seconds)
        self.interval = interval_seconds
        self.on_run_changed = on_run_changed
        self.clock = clock
        self.totals: collections.Counter[str] = collections.Counter()
        self._counter = Counter(
            "relay_sweeper_actions", "sweeper actions, by reason", ["reason"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        self._periodic = PeriodicThread("relay-sweeper", interval_seconds, self.sweep_once)

    def sweep_once(self) -> dict[str, int]:
        """One pass; returns the count of each reason (every reason present, zeros included).

        Each step runs even when an earlier one failed (nonce expiry never waits on time-outs); rows a
        step cannot handle are quarantined by the store. A step that still raised
        makes the pass raise :class:`SweepFailed` at its end, so the worker counts as failing.
        """
        now = self.clock()
        counts = dict.fromkeys(REASONS, 0)
        changed: list[int] = []
        failed: list[str] = []

        def step(name: str, work: Callable[[], None]) -> None:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - the other steps still run
                log.exception("sweep step failed", extra={"step": name})
                failed.append(f"{name}: {type(exc).__name__}: {exc}")

        def time_out() -> None:
            for run, reason in self.store.time_out_runs(
                unstarted_before=now - self.start_timeout, running_before=now - self.run_timeout,
            ):
                counts[reason] += 1
                changed.append(run.id)
                log.info("run timed out", extra={"run": run.id, "backend": run.backend, "reason": reason,
                                                 "delivery": run.delivery_id})

        def expire() -> None:
            counts["nonce_expired"] = self.store.expire_nonces(sent_before=now - self.nonce_ttl)

        def discard() -> None:
            counts["results_discarded"] = self.store.discard_orphaned_results()

        step("time-outs", time_out)
        step("nonce expiry", expire)
        step("orphaned results", discard)
        for reason, count in counts.items():
            if count:
                self._counter.labels(reason=reason).inc(count)
                self.totals[reason] += count
        if any(counts.values()):
            log.info("sweep", extra={"counts": counts})
        if self.on_run_changed is not None:
            for run_pk in changed:
                self.on_run_changed(run_pk)
        if failed:
            raise SweepFailed("; ".join(failed))
        return counts
