"""The verdict: what should be upstream for one run, from its state, its backend's level and its PR's labels.

Used by the reporter (:mod:`relay.results.reporter`), which reads the inputs and writes the outcome;
this module reads and writes nothing. What appears upstream (``decide``) is the backend's level's row in :data:`relay.trust.LEVELS`:

* ``display_on_pr`` never (L1, L2): nothing (L2 results are on the dashboard only).
* ``label_only`` (L3): only while the PR carries the backend's label. The decision is level-triggered:
  a label added before the dispatch, during the run or after it ends all lead to the check on the PR,
  because a change of the PR's labels makes every run of its head pending again (``reports_pending``).
* ``always`` (L4): every PR (and push).
* ``block_pr`` off (L3): failures (and time-outs) are reported as ``neutral`` with the failure
  summary; on (L4): the real conclusion, meant to be a required check.
* ``block_pr`` on, but the backend has an active level hold (it fell below its level's hold bar,
  :mod:`relay.levels.watch`; :meth:`relay.trust.BackendTarget.blocks_under`): non-blocking like L3, from
  the next decision on; the summary says since when and why, and links the backend's level review (a
  commit status links it instead of the run).
* A level change (a descriptor reload; the backend's level version in the store moved on) re-decides
  the runs at open PRs' heads through this same path: a check the new level no longer shows (L4 -> L3
  without the label, L3/L4 -> L2) is finalized ``neutral`` saying so (``withdraw``) instead of being
  left pending or blocking; a level that now shows (L2 -> L3/L4) reports the latest results.
* Any level that shows: a run whose only failing tests are quarantined for its backend (the descriptor's
  ``relay.quarantine``, until each entry's expiry) concludes ``success``; the summary lists those
  failures apart, and always says how many failures were quarantined.
* Any level that shows: a run whose report's torch is not the dispatched commit (:mod:`conformance.provenance`)
  is never a pass: ``failure`` where the backend blocks (L4), ``neutral`` where it does not (L3), and the
  text says which torch was tested and which was expected.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from relay.store.per_test_results import TestResultView
from relay.store.runs import RunView
from relay.trust import BackendTarget, DisplayOnPR, HeldBelowBar, QuarantinedTest

__all__ = ["WITHDRAWN", "Decision", "Failures", "decide", "withdraw"]

_NON_BLOCKING = frozenset({"failure", "timed_out", "action_required"})


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
