"""The run state machine: what a downstream run may do next, and the refusal when it may not.

Triggered by the callback handler (``in_progress``, ``completed``), the sweeper (time-outs) and the
dispatcher marking a ``pull_request.closed`` dispatch sent (cancellation); the store applies the decision inside
the transaction that locks the run. Reads and writes nothing itself: it is pure, so every transition
and every refusal can be tested without a database.

A run is one (delivery, backend, downstream run id, attempt). Its life, in one table::

    dispatched  --in_progress-->  in_progress
    dispatched  --sweeper------>  timed_out     (never started)
    dispatched  --PR closed---->  cancelled
    dispatched  --superseded--->  cancelled     (a newer run of the same PR and backend started)
    in_progress --completed---->  completed | cancelled | timed_out   (by the reported conclusion)
    in_progress --sweeper------>  timed_out     (ran too long)
    in_progress --PR closed---->  cancelled

``completed``, ``timed_out`` and ``cancelled`` are final. A run is superseded when a newer dispatch of
the same PR to the same backend reports ``in_progress`` while it has not started: the backend's
concurrency group cancelled it before it ran, so it would otherwise sit until the sweeper timed it
out as ``never_started`` and count against the backend. Cancelled runs never count against a level. Queue time is ``started_at - dispatched_at``;
execution time is ``finished_at - started_at``.
"""

from __future__ import annotations

import datetime as dt
import enum

__all__ = [
    "CANCEL_REASONS",
    "CONCLUSIONS",
    "FINAL_STATES",
    "TRANSITIONS",
    "RunState",
    "TransitionRefused",
    "check_transition",
    "execution_seconds",
    "queue_seconds",
    "state_for_conclusion",
]


class RunState(str, enum.Enum):
    dispatched = "dispatched"
    in_progress = "in_progress"
    completed = "completed"
    timed_out = "timed_out"
    cancelled = "cancelled"


# The ONE table of allowed transitions: from-state -> the states it may move to.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.dispatched: frozenset({RunState.in_progress, RunState.timed_out, RunState.cancelled}),
    RunState.in_progress: frozenset({RunState.completed, RunState.timed_out, RunState.cancelled}),
    RunState.completed: frozenset(),
    RunState.timed_out: frozenset(),
    RunState.cancelled: frozenset(),
}

FINAL_STATES = frozenset(state for state, nexts in TRANSITIONS.items() if not nexts)

# Why the relay itself cancelled a run (runs.reason).
CANCEL_REASONS = ("pull_request_closed", "superseded")

# GitHub Actions' conclusions (what a downstream workflow's job.status / run conclusion can be).
CONCLUSIONS = ("success", "failure", "cancelled", "timed_out", "neutral", "skipped", "action_required")


class TransitionRefused(ValueError):
    """A transition the table does not allow; ``code`` is a stable machine-readable name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def state_for_conclusion(conclusion: str) -> RunState:
    """The final state a ``completed`` callback moves a run to, given its conclusion."""
    if conclusion == "cancelled":
        return RunState.cancelled
    if conclusion == "timed_out":
        return RunState.timed_out
    return RunState.completed


def check_transition(current: RunState, target: RunState, *, run: str) -> None:
    """check_transition(current, target, run=description): return if allowed, else raise TransitionRefused.

    ``run`` names the run in the message ("cuda run 42 attempt 1"), so the caller sees which one.
    """
    if target in TRANSITIONS[current]:
        return
    if current is RunState.dispatched:
        raise TransitionRefused(
            "completed_before_in_progress",
            f"{run} reported {target.value} before in_progress; call back with state in_progress when the run starts",
        )
    if current is RunState.in_progress and target is RunState.in_progress:
        raise TransitionRefused("replay", f"{run} is already in_progress; this callback is a replay")
    if current is RunState.completed and target in (RunState.completed, RunState.cancelled, RunState.timed_out):
        raise TransitionRefused("already_completed", f"{run} already completed; a second completed is refused")
    if current in FINAL_STATES:
        raise TransitionRefused(
            f"already_{current.value}",
            f"{run} is already {current.value}; a callback ({target.value}) cannot change a finished run",
        )
    raise TransitionRefused("invalid_transition", f"{run}: {current.value} -> {target.value} is not allowed")


def queue_seconds(dispatched_at: dt.datetime, started_at: dt.datetime | None) -> float | None:
    return None if started_at is None else max(0.0, (started_at - dispatched_at).total_seconds())


def execution_seconds(started_at: dt.datetime | None, finished_at: dt.datetime | None) -> float | None:
    if started_at is None or finished_at is None:
        return None
    return max(0.0, (finished_at - started_at).total_seconds())
