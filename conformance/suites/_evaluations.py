"""Groups of cases evaluated by one ``ranks.run`` each and shared by every test of the group (the DTensor suites).

A group's rank function returns ``{case id: record}`` on every rank (the ranks agreeing on each
case's outcome, ``_dtensor_mesh``); each test then asserts its own record with a verdict.

A rank that dies during an evaluation, or an evaluation that does not finish within the pool's
timeout, is a failure of the backend, not a verdict on any one case, and it would fail every test of
the group. The pool respawns its ranks and the group is evaluated again,
up to ``EVALUATIONS_AFTER_A_CRASH`` more times: the first evaluation that completes decides, and every
test of the group warns (``RankCrashWarning``) with each crash or timeout, so an intermittent one is
reported, never hidden. When every evaluation fails so, every test of the group fails with the last.
(Over gloo, torch 2.13's DTensor argmax/argmin sometimes corrupts its rank's heap: docs/known-bugs.md #18;
that suite evaluates its groups in ``batches`` of ``CASES_PER_EVALUATION`` cases.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from conformance.checks import ConformanceFailure
from conformance.descriptors import Semantics
from conformance.ranks import RankCrashed, RankTimeout


class RankCrashWarning(UserWarning):
    """A group of cases was evaluated again because a rank died, or the evaluation timed out, the first time."""


EVALUATIONS_AFTER_A_CRASH = 2

# Cases a suite evaluates in one ranks.run when its groups are large (dtensor_argminmax: about 400 per
# placement). A crash costs only its batch, evaluated again; and an intermittent crash that strikes once
# every few hundred cases (known bug 18) rarely strikes the same small batch on every evaluation, where it
# used up every evaluation of a 400-case group in some runs. Each batch costs one more ranks.run (about a
# millisecond) on the mesh the earlier batches built.
CASES_PER_EVALUATION = 24


def batches(keys: Sequence[str], size: int = CASES_PER_EVALUATION) -> dict[str, tuple[str, ...]]:
    """{key: the batch of ``keys`` it is evaluated in}: ``keys`` cut in order into batches of ``size``."""
    cut = [tuple(keys[start:start + size]) for start in range(0, len(keys), size)]
    return {key: batch for batch in cut for key in batch}


@dataclass(frozen=True)
class _Outcome:
    per_rank: list | None
    error: AssertionError | None
    crashes: tuple[str, ...]


def _failure_summary(exc: RankCrashed | RankTimeout) -> str:
    """The summary and how each dead rank ended (its signal, and the fatal error's words, e.g. glibc's
    heap-corruption message)."""
    return "; ".join([exc.summary] + [f"rank {error.rank} {error.message}" for error in exc.errors
                                      if error.exc_type == "RankGone"])


def evaluations_after_a_crash(semantics) -> int:
    """How often a group is evaluated again after a crash: where a rank left waiting in a collective is
    torn down by the backend's watchdog (``semantics.collective_timeout: aborts_process``), a case on
    which the ranks disagree crashes its group every time, so evaluating it again only costs time."""
    return 0 if semantics.collective_timeout == "aborts_process" else EVALUATIONS_AFTER_A_CRASH


def _evaluate(ranks, fn: Callable, args: tuple) -> _Outcome:
    crashes: list[str] = []
    # The ``ranks`` fixture carries the descriptor; a bare RankPool (the project's tests) has gloo's semantics.
    again = evaluations_after_a_crash(getattr(ranks.descriptor, "semantics", Semantics()))
    while True:
        try:
            return _Outcome(ranks.run(fn, *args), None, tuple(crashes))
        except (RankCrashed, RankTimeout) as exc:
            crashes.append(_failure_summary(exc))
            if len(crashes) > again:
                if again == 0:  # say why there was no second evaluation, and how to find the case
                    exc = type(exc)(f"{exc.summary} (not evaluated again: on {ranks.descriptor.name} a rank left "
                                    "waiting for a peer that raised is torn down by the watchdog, "
                                    "semantics.collective_timeout: aborts_process; run the group's tests one by "
                                    "one with -k to find the case the ranks disagree on)", exc.errors, exc.stacks)
                return _Outcome(None, exc, tuple(crashes))
        except AssertionError as exc:  # RankError: the whole evaluation failed; every case says so
            return _Outcome(None, exc, tuple(crashes))


class Evaluations:
    """The outcome of each group's evaluation in this process, keyed by the group and the world size."""

    def __init__(self) -> None:
        self._outcomes: dict[tuple, _Outcome] = {}

    def records(self, ranks, key: tuple, fn: Callable, *args: Any) -> list[dict]:
        """Each rank's ``{case id: record}`` for group ``key`` (evaluating it on first use), or its error."""
        key = (*key, ranks.world_size)
        if key not in self._outcomes:
            self._outcomes[key] = _evaluate(ranks, fn, args)
        outcome = self._outcomes[key]
        if outcome.crashes:
            what = ("crashed or timed out every time" if outcome.error is not None
                    else "was evaluated again on fresh ranks")
            warnings.warn(RankCrashWarning(f"{getattr(fn, '__name__', fn)} {what} after {len(outcome.crashes)} "
                                           f"crash(es) or timeout(s): " + " | ".join(outcome.crashes)), stacklevel=2)
        if outcome.error is not None:  # one error for every test of the group: drop the last test's frames
            raise outcome.error.with_traceback(None)
        return outcome.per_rank


def assert_verdicts(per_rank: list[dict], case_id: str, verdict: Callable[[dict], str | None], what: str) -> None:
    """Raise ``ConformanceFailure`` listing each distinct problem ``verdict`` finds in the ranks' records
    of ``case_id``, with the ranks that have it."""
    problems: dict[str, list[int]] = {}
    for rank, records in enumerate(per_rank):
        if (message := verdict(records[case_id])) is not None:
            problems.setdefault(message, []).append(rank)
    if problems:
        lines = [f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {m}" for m, r in problems.items()]
        raise ConformanceFailure(f"{what}:\n  " + "\n  ".join(lines))
