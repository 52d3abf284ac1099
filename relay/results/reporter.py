"""Upstream reporting: a run's state as a check run or a commit status on the upstream PR, by trust level.

Finds its work through store rows (``Store.reports_pending``): every run whose state, or whose PR's
labels at its head, changed after the last decision recorded for it. Woken after every accepted
callback, sweeper time-out and dispatch that starts a run (``wake()``), and polls for what other
processes changed. Reads the run, its failing tests and the PR's labels; writes to GitHub only
through :mod:`relay.github`, then records what it decided (per run and target, with the versions it
read), so a state already reported is never sent again and a state not yet reported is never lost.

What appears upstream is the verdict's (:mod:`relay.results.verdict`), in the words of
:mod:`relay.results.summary`. Two modes, from the relay's GitHub credentials: a GitHub App writes check runs (name
``crcr/<backend>``, ``external_id`` = the run's id, details link = the dashboard's run page, summary
with per-suite counts and the first failing tests); a plain token writes commit statuses (context
``crcr/<backend>``, description cut to 140 characters). Commit statuses have no neutral state: an L3
failure is reported as ``success`` whose description starts with ``neutral (non-blocking)``, so the
PR is not marked red by a backend that cannot block it.

GitHub failures: retryable and rate-limited ones leave the state unrecorded and retry later;
permanent ones (a 422, a SHA gone after a force-push) are recorded with the error and not retried.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from relay.github import CallResult, GitHubCallError, PermanentError, RateLimitedError
from relay.periodic import PeriodicThread, RunsPeriodically
from relay.results import fixed_entries
from relay.results.summary import check_title, github_time, md_code, status_description, summary_markdown
from relay.results.verdict import Decision, Failures, decide, withdraw
from relay.store.base import utcnow
from relay.store.errors import StoreUnavailable
from relay.store.per_test_results import FAILING_OUTCOMES
from relay.store.reported_states import NOT_SHOWN, PendingReport
from relay.store.runs import RunView
from relay.trust import BackendTarget

__all__ = ["CHECK_RUN", "STATUS", "Reporter", "ReportingClient", "ReportingWorker"]

log = logging.getLogger("relay.reporting")

CHECK_RUN = "check_run"
STATUS = "status"


class ReportingClient(Protocol):
    """The GitHub calls reporting makes (:class:`relay.github.GitHubClient` has them)."""

    def create_status(self, repository: str, sha: str, state: str, *, context: str, description: str | None = None,
                      target_url: str | None = None) -> CallResult: ...

    def create_check_run(self, repository: str, *, name: str, head_sha: str, **fields: Any) -> CallResult: ...

    def update_check_run(self, repository: str, check_run_id: int, **fields: Any) -> CallResult: ...


def _shown(state: str) -> bool:
    """Something is upstream for the run: a check or status, or a withdrawal (re-said at a later level change)."""
    return state != NOT_SHOWN


def _level_version(pending: PendingReport, target: BackendTarget | None) -> dt.datetime | None:
    """The backend level version this decision is made from: the store's, once this process decides
    with the level the store holds (a process that has not reloaded the descriptors yet keeps the
    version it decided from, so the run stays pending until it has)."""
    previous = pending.previous.level_changed_at if pending.previous is not None else None
    if pending.backend_level is None or target is None or target.level.value != pending.backend_level:
        return previous
    return pending.level_changed_at


def _status_state(decision: Decision) -> str:
    if not decision.final:
        return "pending"
    return {"success": "success", "neutral": "success", "skipped": "success", "failure": "failure"}.get(
        decision.conclusion or "", "error"
    )


class Reporter:
    """Reporter(store, github, targets, mode=CHECK_RUN|STATUS, dashboard_url=...): reconciles runs upstream."""

    def __init__(self, store, github: ReportingClient, targets: Mapping[str, BackendTarget], *, mode: str,
                 dashboard_url: str):
        if mode not in (CHECK_RUN, STATUS):
            raise ValueError(f"reporting mode {mode!r}; use {CHECK_RUN!r} (GitHub App) or {STATUS!r} (token)")
        self.store = store
        self.github = github
        self.targets = dict(targets)
        self.mode = mode
        self.dashboard_url = dashboard_url.rstrip("/")

    def details_url(self, run: RunView) -> str:
        return f"{self.dashboard_url}/runs/{run.id}"

    def review_url(self, backend: str) -> str:
        """The backend's dashboard page: its level review, criteria and holds."""
        return f"{self.dashboard_url}/backends/{backend}"

    def report_run(self, run_pk: int) -> str:
        """Bring one run's upstream state up to date (see :meth:`report`); reads the run and its PR."""
        run = self.store.run(run_pk)
        if run is None:
            return "not_shown"
        labels = labels_at = None
        if run.pr_number is not None:
            pr = self.store.pull_request(run.upstream_repository, run.pr_number)
            labels, labels_at = (tuple(pr.labels), pr.recorded_at) if pr is not None else ((), None)
        return self.report(PendingReport(run, labels, labels_at, self.store.reported_state(run.id, self.mode)))

    def report(self, pending: PendingReport) -> str:
        """Decide one run from the versions read, write upstream if that changes what is shown there, and
        record the decision with those versions (so the run leaves the pending list until it changes
        again). Returns ``not_shown``, ``unchanged``, ``reported`` or ``failed_permanently``; raises
        retryable GitHub errors with nothing recorded."""
        run, previous = pending.run, pending.previous
        target = self.targets.get(run.backend)
        decision = None if target is None else decide(run, target, pending.labels)
        split, fixed = Failures(), ()
        if decision is not None and decision.final:
            # A blocking level's check asks whether a level hold suspends it (at the decision: from the next run on).
            hold = self.store.current_level_hold(run.backend) if target.blocks else None
            split = Failures.split(target, self.store.test_results([run.id], FAILING_OUTCOMES), utcnow().date())
            fixed = fixed_entries.of_run(run)
            decision = decide(run, target, pending.labels, only_quarantined=split.only_quarantined(run), hold=hold)
        versions = {"run_updated_at": run.updated_at, "labels_recorded_at": pending.labels_recorded_at,
                    "level_changed_at": _level_version(pending, target)}
        if (decision is None and target is not None and previous is not None and _shown(previous.state)
                and versions["level_changed_at"] is not None
                and versions["level_changed_at"] != previous.level_changed_at):
            decision = withdraw(target)  # its new level took the check off this PR: finalize it, say why
        if decision is None or (previous is not None and previous.state == decision.key):
            # Nothing new to show: keep what is upstream (a check is never taken back), note the versions.
            outcome = "not_shown" if decision is None else "unchanged"
            if previous is None or (previous.run_updated_at, previous.labels_recorded_at,
                                    previous.level_changed_at) != tuple(versions.values()):
                self.store.record_reported_state(
                    run.id, self.mode, previous.state if previous else NOT_SHOWN,
                    last_error=previous.last_error if previous else None, **versions)
            return outcome
        try:
            external_id = self._write(run, decision, split, previous.external_id if previous else None, fixed)
        except PermanentError as exc:
            log.warning("permanent GitHub error while reporting; not retried", extra={
                "run": run.id, "backend": run.backend, "error": exc.message})
            self.store.record_reported_state(run.id, self.mode, decision.key, last_error=exc.message[:2000], **versions)
            return "failed_permanently"
        self.store.record_reported_state(run.id, self.mode, decision.key, external_id=external_id, **versions)
        log.info("reported upstream", extra={"run": run.id, "backend": run.backend, "state": decision.key,
                                             "mode": self.mode})
        return "reported"

    def _write(self, run: RunView, decision: Decision, split: Failures, check_run_id: int | None,
               fixed: tuple[fixed_entries.FixedEntry, ...] = ()) -> int | None:
        name = f"crcr/{run.backend}"
        details = self.details_url(run)
        if self.mode == STATUS:
            self.github.create_status(
                run.upstream_repository, run.head_sha, _status_state(decision), context=name,
                description=status_description(run, decision, split, fixed),
                target_url=self.review_url(run.backend) if decision.hold is not None else details,
            )
            return None
        fields: dict[str, Any] = {"status": decision.status, "details_url": details, "external_id": str(run.id)}
        if decision.status != "queued":
            fields["started_at"] = github_time(run.started_at or run.dispatched_at)
        if decision.withdrawn:
            fields["conclusion"] = decision.conclusion
            fields["completed_at"] = github_time(utcnow())
            fields["output"] = {"title": f"{name}: {decision.withdrawn}"[:255],
                                "summary": f"{md_code(decision.withdrawn)}\n\nThe run's results: {details}"}
        elif decision.final:
            fields["conclusion"] = decision.conclusion
            fields["completed_at"] = github_time(run.finished_at or utcnow())
            fields["output"] = {
                "title": f"{name}: {check_title(run, split)}"[:255],
                "summary": summary_markdown(run, split, details, decision.hold, self.review_url(run.backend), fixed),
            }
        if check_run_id is None:
            result = self.github.create_check_run(run.upstream_repository, name=name, head_sha=run.head_sha, **fields)
            return int(result.data["id"])
        self.github.update_check_run(run.upstream_repository, check_run_id, **fields)
        return check_run_id


class ReportingWorker(RunsPeriodically):
    """One thread that reports what the store says is pending (``Store.reports_pending``): runs whose
    state, or whose PR's labels at its head, changed after reporting last decided them.

    ``wake()`` makes it look now (a callback, a time-out, a dispatch that started a run); it also looks
    every ``poll_seconds``, which picks up what other relay processes changed. The work list is those
    rows, so a restart or a crash loses nothing: whatever was not reported is still pending. The only
    memory is when to retry: a run whose write failed with a retryable GitHub error is left out until
    its retry is due, and a rate limit rests every report until GitHub's wait (each capped at
    ``max_retry_wait``).
    """

    def __init__(self, reporter: Reporter, *, poll_seconds: float = 5.0, retry_seconds: float = 5.0,
                 max_retry_wait: float = 60.0, window_seconds: float = 7 * 86400.0, batch: int = 200,
                 clock: Callable[[], float] = time.monotonic):
        self.reporter = reporter
        self._poll = poll_seconds
        self._retry_seconds = retry_seconds  # after a 5xx or a network error
        self._max_wait = max_retry_wait
        self._window = dt.timedelta(seconds=window_seconds)
        self._batch = batch
        self._clock = clock
        self._retry_at: dict[int, float] = {}  # run pk -> when to try again; only the worker thread touches it
        self._resting_until = 0.0
        self._more = False  # the last pass filled its batch
        self._passes = threading.Condition()  # guards the pass counters below
        self._started = self._finished = 0
        self._idle = False  # the last finished pass left nothing pending
        self._periodic = PeriodicThread("relay-reporting", poll_seconds, self._counted_pass, next_wait=self._next_wait)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests and shutdown: True once a pass that started after this call left nothing pending."""
        with self._passes:
            after = self._started
        self.wake()
        with self._passes:
            return self._passes.wait_for(lambda: self._finished > after and self._idle, timeout)

    def report_pending_once(self) -> int:
        """One pass over the pending runs; returns how many are still pending after it."""
        now = self._clock()
        if now < self._resting_until:
            return len(self._retry_at) + 1
        for run_pk in [pk for pk, at in self._retry_at.items() if at <= now]:
            del self._retry_at[run_pk]
        store = self.reporter.store
        rows = store.reports_pending(self.reporter.mode, since=utcnow() - self._window, limit=self._batch,
                                     skip=tuple(self._retry_at))
        self._more = len(rows) >= self._batch
        for index, row in enumerate(rows):
            if self._periodic.stopping:
                return len(rows) - index + len(self._retry_at)
            try:
                self.reporter.report(row)
            except RateLimitedError as exc:
                log.warning("reporting rate limited; resting", extra={"run": row.run.id, "error": exc.message,
                                                                       "wait": exc.wait_seconds})
                self._resting_until = self._clock() + min(exc.wait_seconds, self._max_wait)
                return len(rows) - index + len(self._retry_at)
            except GitHubCallError as exc:
                self._retry(row.run.id, self._retry_seconds, exc.message)
            except StoreUnavailable:
                raise
            except Exception as exc:  # one bad run must not stop the others; it is tried again later
                log.exception("reporting run %s failed", row.run.id)
                self._retry(row.run.id, self._max_wait, f"{type(exc).__name__}: {exc}")
        return len(self._retry_at) + (1 if self._more else 0)

    def _retry(self, run_pk: int, wait: float, message: str) -> None:
        log.warning("reporting will retry", extra={"run": run_pk, "error": message, "wait": wait})
        self._retry_at[run_pk] = self._clock() + min(wait, self._max_wait)

    def _next_wait(self) -> float:
        if self._more:
            return 0.0
        now = self._clock()
        due = [self._resting_until, *self._retry_at.values()]
        soonest = min((at for at in due if at > now), default=now + self._poll)
        return max(0.0, min(self._poll, soonest - now))

    def _counted_pass(self) -> None:
        """One pass on the worker's thread, counted for ``wait_idle`` (a pass that raised leaves work pending)."""
        with self._passes:
            self._started += 1
            number = self._started
        still_pending = -1
        try:
            still_pending = self.report_pending_once()
        finally:
            with self._passes:
                self._finished, self._idle = number, still_pending == 0
                self._passes.notify_all()
