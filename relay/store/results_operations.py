"""The store's results-side operations (runs, test results, reported states, nonces, re-run requests).

A mixin of :class:`relay.store.Store`: each method is one transaction, like the intake-side methods.
Triggered by callbacks, reporting, the sweeper, re-runs, the level review and the dashboard; database
errors surface as :class:`relay.store.StoreUnavailable`; a refused run transition as
:class:`relay.store.run_states.TransitionRefused`, with nothing written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from conformance import provenance
from relay.store.run_states import RunState, check_transition
from relay.store import (
    callback_nonces, dispatches, oidc_identities, per_test_results, quarantine, reported_states, rerun_requests,
    result_batches, runs,
)
from relay.store.base import utcnow
from relay.store.errors import guarded
from relay.store.deliveries import DeliveryView
from relay.store.pull_requests import PullRequest, PullRequestSnapshot

__all__ = ["CallbackApplied", "CallbackUpdate", "ResultsOperations"]

log = logging.getLogger("relay.store")


@dataclasses.dataclass(frozen=True)
class CallbackUpdate:
    """A verified callback, reduced to what the run record needs."""

    dispatch_id: int
    run_id: int
    run_attempt: int
    target: RunState
    conclusion: str | None = None
    run_url: str | None = None
    summary: dict[str, Any] | None = None
    torch_version: str | None = None
    reason: str | None = None  # the downstream's own message when it sent no report
    torch_git_version: str | None = None  # the report's torch.git_version (None: no report)
    tests: Sequence[per_test_results.NewTestResult] = ()
    max_attempts: int = 10  # RELAY_CALLBACK_MAX_ATTEMPTS: downstream attempts accepted per dispatch


@dataclasses.dataclass(frozen=True)
class CallbackApplied:
    run: runs.RunView
    previous_state: str
    tests_recorded: int
    superseded: tuple[int, ...] = ()  # older runs of the PR this in_progress cancelled (never started)


class ResultsOperations:
    """Results-side operations; mixed into ``Store`` (which provides ``_transaction`` and ``safe_url``)."""

    # --- callbacks ------------------------------------------------------------------------------
    @guarded
    def find_nonce(self, nonce: str) -> callback_nonces.NonceTarget | None:
        with self._reading() as session:
            return callback_nonces.find(session, nonce)

    @guarded
    def apply_callback(self, update: CallbackUpdate) -> CallbackApplied:
        """Bind the run, check the transition in :mod:`relay.store.run_states`'s table, write it (and the tests).

        A report of more than ``per_test_results.CHUNK_ROWS`` tests is written in chunks first, each in a
        transaction of its own that lets every other waiting write go first (intake's writes go in between), as a result batch the final transition
        commits (see ``result_batches``); a crash in between leaves its chunks invisible, and the sweeper
        deletes them once the run is final. A refused transition, a value the database refuses or an
        outage discards the batch it wrote (where the store still answers).
        """
        tests = tuple(update.tests)
        if update.target is RunState.in_progress or len(tests) <= per_test_results.CHUNK_ROWS:
            return self._finish_run(update, tests, batch=None)
        batch = self._open_result_batch(update)
        try:
            for start in range(0, len(tests), per_test_results.CHUNK_ROWS):
                with self._transaction(bulk=True) as session:  # behind intake and every other write
                    run = session.get(runs.RunRow, batch.run_pk)
                    result_batches.write_chunk(session, batch.id, run, tests[start:start + per_test_results.CHUNK_ROWS],
                                               batch.opened_at)
            return self._finish_run(update, tests, batch=batch)
        except Exception:  # a refused transition (result_batches.BatchGone included), a refused value, an outage
            # Its chunks are invisible either way; deleting them now keeps a retried report from piling up.
            self._discard_result_batch(batch.id, batch.run_pk)
            raise

    def _open_result_batch(self, update: CallbackUpdate) -> result_batches.OpenBatch:
        """Bind the run and check that it may take ``update`` now (so a refused report writes nothing)."""
        now = utcnow()
        with self._transaction() as session:
            row = self._bound_run(session, update, now)
            check_transition(RunState(row.state), update.target, run=runs.view(row).describe())
            return result_batches.OpenBatch(result_batches.open_batch(session, row, now), row.id, now)

    @staticmethod
    def _bound_run(session, update: CallbackUpdate, now: dt.datetime) -> runs.RunRow:
        dispatch = session.get(dispatches.Dispatch, update.dispatch_id, with_for_update=True)
        if dispatch is None:  # pragma: no cover - the nonce lookup found it a moment ago
            raise LookupError(f"dispatch {update.dispatch_id} vanished")
        return runs.bind(session, dispatch, update.run_id, update.run_attempt, now, update.max_attempts)

    def _finish_run(self, update: CallbackUpdate, tests: Sequence[per_test_results.NewTestResult],
                    batch: result_batches.OpenBatch | None) -> CallbackApplied:
        """The run's transition, in one transaction with its tests (``batch`` None) or its batch's commit."""
        now = utcnow()
        with self._transaction() as session:
            row = self._bound_run(session, update, now)
            previous = row.state
            check_transition(RunState(row.state), update.target, run=runs.view(row).describe())
            row.state, row.updated_at = update.target.value, now
            if update.run_url:
                row.run_url = update.run_url[:2000]
            recorded, superseded = 0, []
            if update.target is RunState.in_progress:
                row.started_at = now
                superseded = runs.supersede(session, row, now)
            else:
                row.finished_at = now
                row.conclusion = update.conclusion
                row.summary = update.summary
                row.torch_version = update.torch_version
                if update.torch_git_version is not None:
                    verdict = provenance.check(update.torch_git_version, row.head_sha)
                    row.torch_git_version, row.provenance = verdict.tested, verdict.verdict.value
                if update.reason:
                    row.reason = update.reason
                if batch is None:
                    recorded = per_test_results.add_chunk(session, row, tests, now)
                else:
                    result_batches.commit(session, batch.id, row)
                    recorded = len(tests)
            session.flush()
            return CallbackApplied(runs.view(row), previous, recorded, tuple(r.id for r in superseded))

    def _discard_result_batch(self, batch: int, run_pk: int) -> None:
        """Delete a batch that can never be committed, chunk by chunk (best effort: the sweeper finishes it)."""
        try:
            while True:
                with self._transaction() as session:
                    if result_batches.discard_chunk(session, batch, run_pk):
                        return
        except Exception:  # noqa: BLE001 - the caller's refusal matters more; the sweeper deletes the rest
            log.exception("could not discard result batch %s of run %s; the sweeper will", batch, run_pk)

    @guarded
    def discard_orphaned_results(self, limit: int = 20) -> int:
        """Delete up to ``limit`` result batches whose run is final without them (a crashed or
        superseded callback's chunks); returns how many were deleted."""
        with self._reading() as session:
            found = result_batches.orphans(session, limit)
        for batch, run_pk in found:
            while True:
                with self._transaction() as session:
                    if result_batches.discard_chunk(session, batch, run_pk):
                        break
        return len(found)

    # --- sweeper --------------------------------------------------------------------------------
    @guarded
    def time_out_runs(self, *, unstarted_before: dt.datetime, running_before: dt.datetime) -> list[tuple[runs.RunView, str]]:
        """Time out open runs past their limits, row by row: a run that cannot be changed is quarantined
        (``time_outs`` / ``run <id>``) and the others still time out."""
        now = utcnow()
        with self._transaction() as session:
            def time_out(candidate: tuple[runs.RunRow, str]) -> tuple[runs.RunView, str]:
                row, reason = candidate
                check_transition(RunState(row.state), RunState.timed_out, run=runs.view(row).describe())
                row.state, row.conclusion, row.reason = RunState.timed_out.value, "timed_out", reason
                row.finished_at = row.updated_at = now
                session.flush()
                return runs.view(row), reason

            candidates = runs.timed_out_candidates(session, unstarted_before=unstarted_before, running_before=running_before)
            return quarantine.each_row(session, runs.TIME_OUTS, ((f"run {c[0].id}", c) for c in candidates), time_out, now)

    @guarded
    def expire_nonces(self, sent_before: dt.datetime) -> int:
        with self._transaction() as session:
            return callback_nonces.expire(session, sent_before, utcnow())

    # --- reading runs ---------------------------------------------------------------------------
    @guarded
    def run(self, run_pk: int) -> runs.RunView | None:
        with self._reading() as session:
            return runs.get(session, run_pk)

    @guarded
    def runs(self, **filters: Any) -> list[runs.RunView]:
        """runs(backend=, pr_number=, upstream_repository=, head_sha=, since=, until=, states=, limit=, newest_first=)."""
        with self._reading() as session:
            return runs.query(session, **filters)

    @guarded
    def test_results(self, run_pks: Sequence[int], outcomes: Sequence[str] | None = None) -> list[per_test_results.TestResultView]:
        with self._reading() as session:
            return per_test_results.for_runs(session, run_pks, outcomes)

    @guarded
    def test_history(self, test_id: str, limit: int = 200) -> list[per_test_results.TestResultView]:
        with self._reading() as session:
            return per_test_results.history(session, test_id, limit)

    @guarded
    def failing_tests(
        self, *, since: dt.datetime, backend: str | None = None, after: tuple[str, str] | None = None,
        limit: int = 100, streak_limit: int = 50,
    ) -> tuple[list[per_test_results.FailingStreak], tuple[str, str] | None]:
        """A page of tests failing now and the next page's cursor (see ``per_test_results.failing_now``)."""
        with self._reading() as session:
            return per_test_results.failing_now(session, since=since, backend=backend, after=after, limit=limit,
                                                streak_limit=streak_limit)

    @guarded
    def flaky_tests(self, when: dt.datetime, *, test_id: str | None = None, backend: str | None = None,
                    limit: int = 200) -> list[per_test_results.FlakyEvidence]:
        with self._reading() as session:
            return per_test_results.flaky(session, when, test_id=test_id, backend=backend, limit=limit)

    @guarded
    def newest_results_matching(self, backend: str, pattern: str, *, since: dt.datetime, per_test: int,
                                max_tests: int = 50) -> dict[str, list[per_test_results.TestResultView]]:
        """Each matching test's newest counted results (see ``per_test_results.newest_matching``)."""
        with self._reading() as session:
            return per_test_results.newest_matching(session, backend, pattern, since=since, per_test=per_test,
                                                    max_tests=max_tests)

    @guarded
    def dispatch_payload(self, dispatch_id: int) -> dict[str, Any] | None:
        with self._reading() as session:
            row = session.get(dispatches.Dispatch, dispatch_id)
            return None if row is None else dict(row.client_payload)

    # --- pull requests (read) -------------------------------------------------------------------
    @guarded
    def pull_request(self, repository: str, number: int) -> PullRequestSnapshot | None:
        with self._reading() as session:
            row = session.get(PullRequest, (repository, number))
            if row is None:
                return None
            return PullRequestSnapshot(
                repository=row.repository, number=row.number, head_sha=row.head_sha, state=row.state,
                labels=tuple(row.labels), source_updated_at=row.source_updated_at, recorded_at=row.recorded_at,
            )

    # --- reporting ------------------------------------------------------------------------------
    @guarded
    def reported_state(self, run_pk: int, target: str) -> reported_states.ReportedState | None:
        with self._reading() as session:
            return reported_states.get(session, run_pk, target)

    @guarded
    def reported_states(self, run_pks: Sequence[int]) -> list[reported_states.ReportedState]:
        with self._reading() as session:
            return reported_states.for_runs(session, list(run_pks))

    @guarded
    def record_reported_state(
        self, run_pk: int, target: str, state: str, *, external_id: int | None = None, last_error: str | None = None,
        run_updated_at: dt.datetime | None = None, labels_recorded_at: dt.datetime | None = None,
        level_changed_at: dt.datetime | None = None,
    ) -> None:
        """What reporting decided for a run, and from which run, label and backend level versions (see
        ``reports_pending``)."""
        with self._transaction() as session:
            reported_states.put(session, run_pk, target, state, external_id=external_id, last_error=last_error,
                                now=utcnow(), run_updated_at=run_updated_at, labels_recorded_at=labels_recorded_at,
                                level_changed_at=level_changed_at)

    @guarded
    def reports_pending(self, target: str, *, since: dt.datetime, limit: int = 200,
                        skip: Sequence[int] = ()) -> list[reported_states.PendingReport]:
        """Runs whose state, PR labels or (at an open PR's head) backend level changed after what was
        last decided for ``target``."""
        with self._reading() as session:
            return reported_states.pending(session, target, since=since, limit=limit, skip=tuple(skip))

    # --- quarantine -----------------------------------------------------------------------------
    @guarded
    def quarantine_row(self, worker: str, subject: str, error: str) -> None:
        """Set a row aside for ``worker`` (a pass that failed on it outside the store's own passes)."""
        with self._transaction() as session:
            quarantine.add(session, worker, subject, error, utcnow())

    @guarded
    def quarantined(self, limit: int = 100) -> list[quarantine.QuarantineView]:
        with self._reading() as session:
            return quarantine.list_views(session, limit)

    @guarded
    def quarantine_counts(self) -> dict[str, int]:
        with self._reading() as session:
            return quarantine.counts(session)

    @guarded
    def release_quarantined(self, worker: str, subject: str) -> bool:
        """Let the passes try the row again (after it was fixed); False if it was not quarantined."""
        with self._transaction() as session:
            return quarantine.release(session, worker, subject)

    # --- OIDC identities ------------------------------------------------------------------------
    @guarded
    def pin_oidc_identity(self, backend: str, repository_id: int, repository_owner_id: int) -> tuple[int, int]:
        """The ids pinned for ``backend``: the given ones if this is its first OIDC callback."""
        with self._transaction() as session:
            return oidc_identities.pin(session, backend, repository_id, repository_owner_id, utcnow())

    @guarded
    def oidc_identity(self, backend: str) -> tuple[int, int] | None:
        with self._reading() as session:
            return oidc_identities.get(session, backend)

    # --- re-runs --------------------------------------------------------------------------------
    @guarded
    def unhandled_rerun_requests(self, limit: int = 50) -> list[DeliveryView]:
        """Stored re-run requests not handled yet, oldest first; quarantined ones are left out."""
        with self._reading() as session:
            skip = [s.removeprefix("delivery ") for s in quarantine.keys(session, rerun_requests.RERUNS)]
            return rerun_requests.unhandled(session, limit, skip)

    @guarded
    def record_rerun(
        self, delivery_id: str, *, outcome: str, reason: str | None = None,
        new_dispatches: Sequence[dispatches.NewDispatch] = (),
    ) -> bool:
        """Write the request's outcome and its new outbox rows at once; False if already handled."""
        now = utcnow()
        with self._transaction() as session:
            if rerun_requests.is_handled(session, delivery_id):
                return False
            rerun_requests.add(session, delivery_id, outcome, reason, [d.backend for d in new_dispatches], now)
            for new in new_dispatches:
                dispatches.add(session, delivery_id, new, now)
        return True

    @guarded
    def rerun_request(self, delivery_id: str) -> rerun_requests.RerunRequestView | None:
        with self._reading() as session:
            return rerun_requests.get_view(session, delivery_id)
