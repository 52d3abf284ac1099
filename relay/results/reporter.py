"""Upstream reporting: a run's state as a check run or a commit status on the upstream PR, by trust level.

Finds its work through store rows (``Store.reports_pending``): every run whose state, or whose PR's
labels at its head, changed after the last decision recorded for it. Woken after every accepted
callback, sweeper time-out and dispatch that starts a run (``wake()``), and polls for what other
processes changed. Reads the run, its failing tests and the PR's labels; writes to GitHub only
through :mod:`relay.github`, then records what it decided (per run and target, with the versions it
read), so a state already reported is never sent again and a state not yet reported is never lost.

What appears upstream (``decide``) is the backend's level's row in :data:`relay.trust.LEVELS`:

* ``display_on_pr`` never (L1, L2): nothing (L2 results are on the dashboard only).
* ``label_only`` (L3): only while the PR carries the backend's label. The decision is level-triggered:
  a label added before the dispatch, during the run or after it ends all lead to the check on the PR,
  because a change of the PR's labels makes every run of its head pending again (``reports_pending``).
* ``always`` (L4): every PR (and push).
* ``block_pr`` off (L3): failures (and time-outs) are reported as ``neutral`` with the failure
  summary; on (L4): the real conclusion, meant to be a required check.
* ``block_pr`` on, but the backend has an active level hold (it fell below its level's hold bar,
  :mod:`relay.level_watch`; :meth:`relay.trust.BackendTarget.blocks_under`): non-blocking like L3, from
  the next decision on; the summary says since when and why, and links the backend's level review (a
  commit status links it instead of the run).
* A level change (a descriptor reload; the backend's level version in the store moved on) re-decides
  the runs at open PRs' heads through this same path: a check the new level no longer shows (L4 -> L3
  without the label, L3/L4 -> L2) is finalized ``neutral`` saying so (``withdraw``) instead of being
  left pending or blocking; a level that now shows (L2 -> L3/L4) reports the latest results.
* Any level that shows: a run whose only failing tests are quarantined for its backend (the descriptor's
  ``relay.quarantine``, until each entry's expiry) concludes ``success``; the summary lists those
  failures apart, and always says how many failures were quarantined.
* Any level that shows: a run whose report's torch is not the dispatched commit (:mod:`relay.provenance`)
  is never a pass: ``failure`` where the backend blocks (L4), ``neutral`` where it does not (L3), and the
  text says which torch was tested and which was expected.

Two modes, from the relay's GitHub credentials: a GitHub App writes check runs (name
``crcr/<backend>``, ``external_id`` = the run's id, details link = the dashboard's run page, summary
with per-suite counts and the first failing tests); a plain token writes commit statuses (context
``crcr/<backend>``, description cut to 140 characters). Commit statuses have no neutral state: an L3
failure is reported as ``success`` whose description starts with ``neutral (non-blocking)``, so the
PR is not marked red by a backend that cannot block it.

GitHub failures: retryable and rate-limited ones leave the state unrecorded and retry later;
permanent ones (a 422, a SHA gone after a force-push) are recorded with the error and not retried.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from relay.github import CallResult, GitHubCallError, PermanentError, RateLimitedError
from relay.store.base import utcnow
from relay.store.errors import StoreUnavailable
from relay.store.reported_states import NOT_SHOWN, PendingReport
from relay.store.runs import RunView
from relay.store.per_test_results import FAILING_OUTCOMES, TestResultView
from relay.trust import BackendTarget, DisplayOnPR, HeldBelowBar, QuarantinedTest

__all__ = ["CHECK_RUN", "STATUS", "Decision", "Failures", "Reporter", "ReportingClient", "ReportingWorker", "decide"]

log = logging.getLogger("relay.reporting")

CHECK_RUN = "check_run"
STATUS = "status"
FIRST_FAILURES = 10
SUMMARY_MAX_CHARS = 65_000  # GitHub allows 65 535
DESCRIPTION_MAX_CHARS = 140
_NON_BLOCKING = frozenset({"failure", "timed_out", "action_required"})


class ReportingClient(Protocol):
    """The GitHub calls reporting makes (:class:`relay.github.GitHubClient` has them)."""

    def create_status(self, repository: str, sha: str, state: str, *, context: str, description: str | None = None,
                      target_url: str | None = None) -> CallResult: ...

    def create_check_run(self, repository: str, *, name: str, head_sha: str, **fields: Any) -> CallResult: ...

    def update_check_run(self, repository: str, check_run_id: int, **fields: Any) -> CallResult: ...


@dataclasses.dataclass(frozen=True)
class Decision:
    """What should be upstream for one run: None from ``decide`` means nothing."""

    status: str  # queued | in_progress | completed
    conclusion: str | None  # the upstream conclusion (L3 failures already neutral)
    key: str  # compared with the last reported state
    # The active level hold that made a blocking level's check non-blocking (shown in the summary).
    hold: HeldBelowBar | None = dataclasses.field(default=None, compare=False)
    # Set when a level change took the check off this PR: why it was finalized (see ``withdraw``).
    withdrawn: str | None = dataclasses.field(default=None, compare=False)

    @property
    def final(self) -> bool:
        return self.status == "completed"


@dataclasses.dataclass(frozen=True)
class Failures:
    """A finished run's failing tests, split by the backend's quarantine list on the day of reporting."""

    blocking: tuple[TestResultView, ...] = ()
    quarantined: tuple[tuple[TestResultView, QuarantinedTest], ...] = ()

    @classmethod
    def split(cls, target: BackendTarget, failures: list[TestResultView], day: dt.date) -> "Failures":
        blocking, quarantined = [], []
        for failure in failures:
            entry = target.quarantined(failure.test_id, day)
            if entry is None:
                blocking.append(failure)
            else:
                quarantined.append((failure, entry))
        return cls(tuple(blocking), tuple(quarantined))

    def only_quarantined(self, run: RunView) -> bool:
        """Whether the run failed because of quarantined tests and nothing else: every failure the
        report counts is a recorded test result, and each of them is quarantined."""
        if run.state != "completed" or run.conclusion != "failure" or not self.quarantined or self.blocking:
            return False
        counts = (run.summary or {}).get("counts") or {}
        counted = sum(counts.get(key) or 0 for key in ("failed", "errors", "xpassed"))
        return counted == len(self.quarantined)


def _upstream_conclusion(run: RunView, blocks: bool, only_quarantined: bool = False) -> str:
    conclusion = run.conclusion or ("timed_out" if run.state == "timed_out" else "cancelled")
    if only_quarantined and not run.provenance_problem:
        return "success"  # quarantined failures never decide a check
    if run.provenance_problem and conclusion not in ("cancelled", "timed_out"):
        # A result of another torch than the dispatched commit says nothing about this PR: never a pass.
        return "failure" if blocks else "neutral"
    if not blocks and conclusion in _NON_BLOCKING:
        return "neutral"
    return conclusion


def decide(run: RunView, target: BackendTarget, pr_labels: tuple[str, ...] | None,
           only_quarantined: bool = False, hold: HeldBelowBar | None = None) -> Decision | None:
    """decide(run, target, labels of its PR or None for a push, whether its only failures are
    quarantined, the backend's active level hold) -> what to show upstream, or None."""
    if not target.shows_on_pr(pr_labels):
        return None
    if run.state == "dispatched":
        return Decision("queued", None, "queued")
    if run.state == "in_progress":
        return Decision("in_progress", None, "in_progress")
    blocks = target.blocks_under(hold)
    conclusion = _upstream_conclusion(run, blocks, only_quarantined)
    return Decision("completed", conclusion, f"completed:{conclusion}",
                    hold=hold if target.blocks and not blocks else None)


WITHDRAWN = "withdrawn"  # the state key prefix of a check a level change took off a PR


def withdraw(target: BackendTarget) -> Decision:
    """The final state of a check its backend's new level no longer shows on this PR: ``neutral``,
    saying why, instead of a check left pending or blocking (a check is never deleted)."""
    level = target.level.value
    if target.switches.display_on_pr is DisplayOnPR.never:
        why = f"no longer reported: {target.name} is now {level}, whose results show on the dashboard only"
    else:
        why = f"no longer blocking: {target.name} is now {level}, whose check shows only on PRs labelled {target.label}"
    return Decision("completed", "neutral", f"{WITHDRAWN}:{level}", withdrawn=why)


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


def _counts_line(run: RunView) -> str:
    counts = (run.summary or {}).get("counts")
    if not counts:
        return {"timed_out": "timed out", "cancelled": "cancelled"}.get(run.state, "no report")
    parts = [f"{counts.get('passed', 0)} passed"]
    for key, word in (("failed", "failed"), ("errors", "errors"), ("xpassed", "xpassed"), ("skipped", "skipped")):
        if counts.get(key):
            parts.append(f"{counts[key]} {word}")
    return ", ".join(parts)


def md_code(text: str, *, in_table: bool = False) -> str:
    """``text`` as one inert Markdown code span: no link, image, HTML, mention or autolink survives.

    Everything a report carries (test ids, suite names, torch versions) is written through this. The
    fence is one backtick longer than the longest run of backticks inside, so nothing can close it
    early; line breaks become spaces (they would end a list item or a table row); in a table, ``|``
    is escaped, because GitHub splits cells before it reads code spans.
    """
    flat = " ".join(text.split())
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    if in_table:
        flat = flat.replace("|", "\\|")
    return f"{fence} {flat} {fence}" if flat else "` `"


def plain_text(text: str) -> str:
    """One line of printable text (commit status descriptions are shown as they are sent)."""
    return "".join(ch if ch.isprintable() else " " for ch in " ".join(text.split()))


def _quarantined_line(failures: Failures) -> str:
    return f"{len(failures.quarantined)} quarantined failure(s) (non-blocking)"


def held_line(hold: HeldBelowBar, review_url: str) -> str:
    return (f"**Non-blocking**: below its {hold.level} bar since {_iso(hold.started_at)} "
            f"({md_code(hold.reason)}); level review: {review_url}")


def summary_markdown(run: RunView, split: Failures, details_url: str, hold: HeldBelowBar | None = None,
                     review_url: str = "") -> str:
    failures = list(split.blocking)
    lines = [f"**{_counts_line(run)}** on `{run.backend}`; {_quarantined_line(split)}"]
    if run.torch_version:
        lines[0] += f" (torch {md_code(run.torch_version)})"
    if hold is not None:
        lines.append("\n" + held_line(hold, review_url))
    if run.provenance_problem:
        lines.append(f"\n**Not a result for this commit**: {md_code(run.provenance_problem)}")
    if run.reason:
        lines.append(f"\nReason: {run.reason.replace('_', ' ')}")
    suites = (run.summary or {}).get("suites") or {}
    if suites:
        lines += ["", "| suite | passed | failed | errors | skipped | xfailed | total |", "|---|---|---|---|---|---|---|"]
        for suite, c in suites.items():
            lines.append(
                f"| {md_code(suite, in_table=True)} | {c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('errors', 0)} | "
                f"{c.get('skipped', 0)} | {c.get('xfailed', 0)} | {c.get('total', 0)} |"
            )
    if failures:
        lines += ["", f"First failing tests ({min(len(failures), FIRST_FAILURES)} of {len(failures)}):", ""]
        for failure in failures[:FIRST_FAILURES]:
            message = failure.message.strip()[:1500]
            lines.append(f"- {md_code(failure.test_id)} ({failure.outcome})")
            if message:
                # A fenced block is literal text; its fence outgrows any backtick run of the message.
                fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", message)), default=0))
                lines += [f"  {fence}", *("  " + m for m in message.splitlines()[:15]), f"  {fence}"]
    if split.quarantined:
        lines += ["", f"Quarantined failing tests (non-blocking; {len(split.quarantined)}):", ""]
        for failure, entry in split.quarantined[:FIRST_FAILURES]:
            lines.append(f"- {md_code(failure.test_id)} ({failure.outcome}): quarantined until {entry.expires.isoformat()}, "
                         f"{md_code(entry.reason)}")
    lines += ["", f"Full results: {details_url}"]
    text = "\n".join(lines)
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 20] + "\n\n(cut)"


def status_description(run: RunView, decision: Decision, split: Failures) -> str:
    failures = split.blocking
    if decision.withdrawn:
        text = f"neutral: {decision.withdrawn}"
    elif decision.status == "queued":
        text = "queued: waiting for the backend's runner"
    elif decision.status == "in_progress":
        text = "running the conformance suite"
    else:
        text = _counts_line(run)
        if split.quarantined:
            text += f"; {len(split.quarantined)} quarantined"
        if failures:
            text += f"; first: {plain_text(failures[0].test_id)}"
        if run.provenance_problem:
            text = plain_text(run.provenance_problem.split(" (")[0]) + f"; {text}"
        if decision.conclusion == "neutral":
            held = f", below its {decision.hold.level} bar" if decision.hold is not None else ""
            text = f"neutral (non-blocking{held}): {text}"
    return text if len(text) <= DESCRIPTION_MAX_CHARS else text[: DESCRIPTION_MAX_CHARS - 1] + "…"


def _status_state(decision: Decision) -> str:
    if not decision.final:
        return "pending"
    return {"success": "success", "neutral": "success", "skipped": "success", "failure": "failure"}.get(
        decision.conclusion or "", "error"
    )


def _iso(when: dt.datetime | None) -> str | None:
    return None if when is None else when.replace(microsecond=0).isoformat() + "Z"


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
        split = Failures()
        if decision is not None and decision.final:
            # A blocking level's check asks whether a level hold suspends it (at the decision: from the next run on).
            hold = self.store.current_level_hold(run.backend) if target.blocks else None
            split = Failures.split(target, self.store.test_results([run.id], FAILING_OUTCOMES), utcnow().date())
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
            external_id = self._write(run, decision, split, previous.external_id if previous else None)
        except PermanentError as exc:
            log.warning("permanent GitHub error while reporting; not retried", extra={
                "run": run.id, "backend": run.backend, "error": exc.message})
            self.store.record_reported_state(run.id, self.mode, decision.key, last_error=exc.message[:2000], **versions)
            return "failed_permanently"
        self.store.record_reported_state(run.id, self.mode, decision.key, external_id=external_id, **versions)
        log.info("reported upstream", extra={"run": run.id, "backend": run.backend, "state": decision.key,
                                             "mode": self.mode})
        return "reported"

    def _write(self, run: RunView, decision: Decision, split: Failures, check_run_id: int | None) -> int | None:
        name = f"crcr/{run.backend}"
        details = self.details_url(run)
        if self.mode == STATUS:
            self.github.create_status(
                run.upstream_repository, run.head_sha, _status_state(decision), context=name,
                description=status_description(run, decision, split),
                target_url=self.review_url(run.backend) if decision.hold is not None else details,
            )
            return None
        fields: dict[str, Any] = {"status": decision.status, "details_url": details, "external_id": str(run.id)}
        if decision.status != "queued":
            fields["started_at"] = _iso(run.started_at or run.dispatched_at)
        if decision.withdrawn:
            fields["conclusion"] = decision.conclusion
            fields["completed_at"] = _iso(utcnow())
            fields["output"] = {"title": f"{name}: {decision.withdrawn}"[:255],
                                "summary": f"{md_code(decision.withdrawn)}\n\nThe run's results: {details}"}
        elif decision.final:
            fields["conclusion"] = decision.conclusion
            fields["completed_at"] = _iso(run.finished_at or utcnow())
            fields["output"] = {
                "title": f"{name}: {_counts_line(run)}; {_quarantined_line(split)}"[:255],
                "summary": summary_markdown(run, split, details, decision.hold, self.review_url(run.backend)),
            }
        if check_run_id is None:
            result = self.github.create_check_run(run.upstream_repository, name=name, head_sha=run.head_sha, **fields)
            return int(result.data["id"])
        self.github.update_check_run(run.upstream_repository, check_run_id, **fields)
        return check_run_id


class ReportingWorker:
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
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._passes = threading.Condition()  # guards the pass counters below
        self._started = self._finished = 0
        self._idle = False  # the last finished pass left nothing pending

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="relay-reporting", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Look for pending reports now."""
        self._wake.set()

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
            if self._stop.is_set():
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

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            with self._passes:
                self._started += 1
                number = self._started
            try:
                still_pending = self.report_pending_once()
            except Exception:
                log.exception("reporting pass failed; next pass in %.1f s", self._poll)
                still_pending = -1
            with self._passes:
                self._finished, self._idle = number, still_pending == 0
                self._passes.notify_all()
            self._wake.wait(self._next_wait())
