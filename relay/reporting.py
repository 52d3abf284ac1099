"""Upstream reporting: a run's state as a check run or a commit status on the upstream PR, by trust level.

Triggered after every accepted callback and every sweeper time-out (``submit(run_pk)``), and by a
label watch that re-examines a PR whenever intake records a new label set for it. Reads the run,
its failing tests, the PR's current labels and the last state reported; writes to GitHub only
through :mod:`relay.github`, then records what it reported (per run and target) so a state already
reported is never sent again.

What appears upstream (``decide``) is the backend's level's row in :data:`relay.trust.LEVELS`:

* ``display_on_pr`` never (L1, L2): nothing (L2 results are on the dashboard only).
* ``label_only`` (L3): only while the PR carries the backend's label. The decision is level-triggered:
  a label added before the dispatch, during the run or after it ends all lead to the check on the PR,
  because the label watch re-decides every run of the PR's head when the labels change.
* ``always`` (L4): every PR (and push).
* ``block_pr`` off (L3): failures (and time-outs) are reported as ``neutral`` with the failure
  summary; on (L4): the real conclusion, meant to be a required check.
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
import heapq
import logging
import queue
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from relay.github import CallResult, GitHubCallError, PermanentError, RateLimitedError
from relay.store.base import utcnow
from relay.store.runs import RunView
from relay.store.per_test_results import FAILING_OUTCOMES, TestResultView
from relay.trust import BackendTarget

__all__ = ["CHECK_RUN", "STATUS", "Decision", "Reporter", "ReportingClient", "ReportingWorker", "decide"]

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

    @property
    def final(self) -> bool:
        return self.status == "completed"


def _upstream_conclusion(run: RunView, target: BackendTarget) -> str:
    conclusion = run.conclusion or ("timed_out" if run.state == "timed_out" else "cancelled")
    if run.provenance_problem and conclusion not in ("cancelled", "timed_out"):
        # A result of another torch than the dispatched commit says nothing about this PR: never a pass.
        return "failure" if target.blocks else "neutral"
    if not target.blocks and conclusion in _NON_BLOCKING:
        return "neutral"
    return conclusion


def decide(run: RunView, target: BackendTarget, pr_labels: tuple[str, ...] | None) -> Decision | None:
    """decide(run, target, labels of its PR or None for a push) -> what to show upstream, or None."""
    if not target.shows_on_pr(pr_labels):
        return None
    if run.state == "dispatched":
        return Decision("queued", None, "queued")
    if run.state == "in_progress":
        return Decision("in_progress", None, "in_progress")
    conclusion = _upstream_conclusion(run, target)
    return Decision("completed", conclusion, f"completed:{conclusion}")


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


def summary_markdown(run: RunView, failures: list[TestResultView], details_url: str) -> str:
    lines = [f"**{_counts_line(run)}** on `{run.backend}`"]
    if run.torch_version:
        lines[0] += f" (torch {md_code(run.torch_version)})"
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
    lines += ["", f"Full results: {details_url}"]
    text = "\n".join(lines)
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 20] + "\n\n(cut)"


def status_description(run: RunView, decision: Decision, failures: list[TestResultView]) -> str:
    if decision.status == "queued":
        text = "queued: waiting for the backend's runner"
    elif decision.status == "in_progress":
        text = "running the conformance suite"
    else:
        text = _counts_line(run)
        if failures:
            text += f"; first: {plain_text(failures[0].test_id)}"
        if run.provenance_problem:
            text = plain_text(run.provenance_problem.split(" (")[0]) + f"; {text}"
        if decision.conclusion == "neutral":
            text = f"neutral (non-blocking): {text}"
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

    def report_run(self, run_pk: int) -> str:
        """Bring one run's upstream state up to date. Returns what happened (for logs and tests):
        ``not_shown``, ``unchanged``, ``reported``, ``failed_permanently``; raises retryable errors."""
        run = self.store.run(run_pk)
        if run is None or run.backend not in self.targets:
            return "not_shown"
        labels = None
        if run.pr_number is not None:
            pr = self.store.pull_request(run.upstream_repository, run.pr_number)
            labels = tuple(pr.labels) if pr is not None else ()
        return self._report(run, labels)

    def _report(self, run: RunView, labels: tuple[str, ...] | None) -> str:
        """``report_run`` for a run already read, with its PR's labels (None for a push)."""
        target = self.targets.get(run.backend)
        decision = None if target is None else decide(run, target, labels)
        if decision is None:
            return "not_shown"
        previous = self.store.reported_state(run.id, self.mode)
        if previous is not None and previous.state == decision.key:
            return "unchanged"
        failures = []
        if decision.final:
            failures = self.store.test_results([run.id], FAILING_OUTCOMES)
        try:
            external_id = self._write(run, decision, failures, previous.external_id if previous else None)
        except PermanentError as exc:
            log.warning("permanent GitHub error while reporting; not retried", extra={
                "run": run.id, "backend": run.backend, "error": exc.message})
            self.store.record_reported_state(run.id, self.mode, decision.key, last_error=exc.message[:2000])
            return "failed_permanently"
        self.store.record_reported_state(run.id, self.mode, decision.key, external_id=external_id)
        log.info("reported upstream", extra={"run": run.id, "backend": run.backend, "state": decision.key,
                                             "mode": self.mode})
        return "reported"

    def _write(self, run: RunView, decision: Decision, failures: list[TestResultView], check_run_id: int | None) -> int | None:
        name = f"crcr/{run.backend}"
        details = self.details_url(run)
        if self.mode == STATUS:
            self.github.create_status(
                run.upstream_repository, run.head_sha, _status_state(decision), context=name,
                description=status_description(run, decision, failures), target_url=details,
            )
            return None
        fields: dict[str, Any] = {"status": decision.status, "details_url": details, "external_id": str(run.id)}
        if decision.status != "queued":
            fields["started_at"] = _iso(run.started_at or run.dispatched_at)
        if decision.final:
            fields["conclusion"] = decision.conclusion
            fields["completed_at"] = _iso(run.finished_at or utcnow())
            fields["output"] = {
                "title": f"{name}: {_counts_line(run)}"[:255],
                "summary": summary_markdown(run, failures, details),
            }
        if check_run_id is None:
            result = self.github.create_check_run(run.upstream_repository, name=name, head_sha=run.head_sha, **fields)
            return int(result.data["id"])
        self.github.update_check_run(run.upstream_repository, check_run_id, **fields)
        return check_run_id

    def reconcile_pull_request(self, repository: str, number: int) -> dict[int, str]:
        """Re-decide every run of the PR's current head (label added or removed)."""
        pr = self.store.pull_request(repository, number)
        if pr is None:
            return {}
        runs = self.store.runs(upstream_repository=repository, pr_number=number, head_sha=pr.head_sha, newest_first=False)
        return {run.id: self._report(run, tuple(pr.labels)) for run in runs}


class ReportingWorker:
    """One thread that reports submitted runs in order and watches PR label changes.

    ``submit`` only enqueues (callbacks answer without waiting for GitHub). Retryable GitHub errors
    put the run back after the wait GitHub asked for (capped): the worker keeps such runs in a heap by
    due time and sleeps on its queue until the earliest is due, a new run arrives or the next label
    watch. Every ``label_poll_seconds`` the worker reads the PRs whose labels intake recorded since its
    last look and reconciles them.
    """

    def __init__(self, reporter: Reporter, *, label_poll_seconds: float = 5.0, max_retry_wait: float = 60.0,
                 lookback_seconds: float = 3600.0):
        self.reporter = reporter
        self._queue: queue.Queue[tuple[float, int] | None] = queue.Queue()
        self._delayed: list[tuple[float, int]] = []  # heap of (due, run_pk); only the worker thread touches it
        self._poll = label_poll_seconds
        self._max_wait = max_retry_wait
        self._watermark = utcnow() - dt.timedelta(seconds=lookback_seconds)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pending = 0  # submitted and not yet handled (retries included), guarded by _settled
        self._settled = threading.Condition()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="relay-reporting", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, run_pk: int, not_before: float = 0.0) -> None:
        with self._settled:
            self._pending += 1
        self._queue.put((not_before, run_pk))

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests and shutdown: True once every submitted run was handled."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout)

    def watch_labels_once(self) -> int:
        changed = self.reporter.store.pull_requests_changed_since(self._watermark)
        for repository, number, recorded_at in changed:
            self._watermark = max(self._watermark, recorded_at)
            for run_pk, outcome in self.reporter.reconcile_pull_request(repository, number).items():
                if outcome == "reported":
                    log.info("label change reported", extra={"run": run_pk, "pr": number})
        return len(changed)

    def _loop(self) -> None:
        next_watch = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_watch:
                try:
                    self.watch_labels_once()
                except Exception:
                    log.exception("label watch failed")
                next_watch = now + self._poll
            while self._delayed and self._delayed[0][0] <= time.monotonic():
                self._handle(heapq.heappop(self._delayed)[1])
            wake_at = min(next_watch, self._delayed[0][0]) if self._delayed else next_watch
            try:
                item = self._queue.get(timeout=max(0.0, wake_at - time.monotonic()))
            except queue.Empty:
                continue
            if item is None:
                continue
            if item[0] > time.monotonic():
                heapq.heappush(self._delayed, item)
            else:
                self._handle(item[1])

    def _handle(self, run_pk: int) -> None:
        try:
            self.reporter.report_run(run_pk)
        except RateLimitedError as exc:
            self._retry(run_pk, exc.wait_seconds, exc)
            return
        except GitHubCallError as exc:
            self._retry(run_pk, 5.0, exc)
            return
        except Exception:
            log.exception("reporting run %s failed", run_pk)
        with self._settled:
            self._pending -= 1
            if self._pending == 0:
                self._settled.notify_all()

    def _retry(self, run_pk: int, wait: float, exc: GitHubCallError) -> None:
        log.warning("reporting will retry", extra={"run": run_pk, "error": exc.message, "wait": wait})
        heapq.heappush(self._delayed, (time.monotonic() + min(wait, self._max_wait), run_pk))
