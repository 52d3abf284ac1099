"""Test results: one row per conformance test of a completed run (suite, test id, outcome, duration, message).

Written by a ``completed`` callback: a report of at most CHUNK_ROWS tests in the transaction that
finishes the run, a bigger one in chunks of its own first (``result_batches``: a result is visible
only once its batch is its run's ``results_batch``, which every read below checks). Read by the dashboard
and its API: a run's failures, one test's history across backends, which tests fail on which
backend since which upstream commit, and which are flaky (``flaky``: both passed and failed for one
backend on one tested torch commit, over re-runs, attempts and ``/retest``). ``test_id`` is ``<suite>::<name>``, the form the backend files'
``known_failures`` use.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence

from sqlalchemy import (
    BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, and_, case, func, insert, or_, select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base
from relay.store.runs import RunRow

__all__ = [
    "FAILING_OUTCOMES", "FailingStreak", "FlakyEvidence", "NewTestResult", "TestResultRow", "TestResultView", "newest_matching",
    "test_id_of",
]

_ID = BigInteger().with_variant(Integer, "sqlite")
MESSAGE_MAX_CHARS = 4000
# unexpected_pass (report 1.1: a backend's known failure that passed) is a pass, never a failure.
FAILING_OUTCOMES = ("failed", "error", "xpassed")
_NOT_COUNTED = ("skipped", "xfailed")  # say nothing about whether a test works


class TestResultRow(Base):
    __tablename__ = "test_results"
    __table_args__ = (
        Index("ix_test_results_test_backend", "test_id", "backend"),
        Index("ix_test_results_run", "run_pk"),
        # "Failing now" walks the failures of one outcome in (backend, test) order from a cursor.
        Index("ix_test_results_outcome_backend_test", "outcome", "backend", "test_id", "recorded_at"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_pk: Mapped[int] = mapped_column(_ID, ForeignKey("runs.id"))
    backend: Mapped[str] = mapped_column(String(100))
    head_sha: Mapped[str] = mapped_column(String(64))
    suite: Mapped[str] = mapped_column(String(200))
    test_id: Mapped[str] = mapped_column(String(500))
    nodeid: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(16))
    duration: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[dt.datetime] = mapped_column(DateTime)
    # The result batch that wrote the row (0: written in the run's final transition); see result_batches.
    batch: Mapped[int] = mapped_column(_ID, default=0, server_default="0")


@dataclasses.dataclass(frozen=True)
class NewTestResult:
    nodeid: str
    suite: str
    outcome: str
    duration: float
    message: str


@dataclasses.dataclass(frozen=True)
class TestResultView:
    run_pk: int
    backend: str
    head_sha: str
    suite: str
    test_id: str
    nodeid: str
    outcome: str
    duration: float
    message: str
    recorded_at: dt.datetime
    pr_number: int | None = None


def test_id_of(suite: str, nodeid: str) -> str:
    """``<suite>::<name>``: the nodeid without its file part (class and parameters kept)."""
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return f"{suite}::{name}"[:500]


# Rows per INSERT: a big report is written as a series of bounded statements (no ORM object per
# test, no statement holding every row), so memory stays proportional to one chunk.
CHUNK_ROWS = 1000


def rows_of(run: RunRow, results: Iterable[NewTestResult], now: dt.datetime, *, batch: int = 0) -> list[dict]:
    """The INSERT parameters of ``results`` of ``run`` (one chunk: the caller bounds how many)."""
    return [{
        "run_pk": run.id, "backend": run.backend, "head_sha": run.head_sha, "suite": r.suite[:200],
        "test_id": test_id_of(r.suite, r.nodeid), "nodeid": r.nodeid, "outcome": r.outcome,
        "duration": r.duration, "message": r.message[:MESSAGE_MAX_CHARS], "recorded_at": now, "batch": batch,
    } for r in results]


def add_chunk(session: Session, run: RunRow, results: Sequence[NewTestResult], now: dt.datetime) -> int:
    """Insert at most CHUNK_ROWS ``results`` inside the run's final transaction (batch 0); returns how many."""
    if len(results) > CHUNK_ROWS:
        raise ValueError(f"{len(results)} results in one statement; more than {CHUNK_ROWS} go through result_batches")
    if results:
        session.execute(insert(TestResultRow), rows_of(run, results, now))
    return len(results)


# Results whose batch is their run's: the only ones any read shows (see result_batches).
_VISIBLE = and_(RunRow.id == TestResultRow.run_pk, RunRow.results_batch == TestResultRow.batch)


def _with_pr_number():
    """Results joined to their run, for the PR number each view carries."""
    return select(TestResultRow, RunRow.pr_number).join(RunRow, _VISIBLE)


def _views(session: Session, stmt) -> list[TestResultView]:
    out = []
    for row, pr_number in session.execute(stmt):
        out.append(TestResultView(
            run_pk=row.run_pk, backend=row.backend, head_sha=row.head_sha, suite=row.suite, test_id=row.test_id,
            nodeid=row.nodeid, outcome=row.outcome, duration=row.duration, message=row.message,
            recorded_at=row.recorded_at, pr_number=pr_number,
        ))
    return out


def for_runs(session: Session, run_pks: Sequence[int], outcomes: Sequence[str] | None = None) -> list[TestResultView]:
    if not run_pks:
        return []
    stmt = _with_pr_number().where(TestResultRow.run_pk.in_(list(run_pks)))
    if outcomes is not None:
        stmt = stmt.where(TestResultRow.outcome.in_(list(outcomes)))
    return _views(session, stmt.order_by(TestResultRow.id))


def history(session: Session, test_id: str, limit: int) -> list[TestResultView]:
    stmt = (
        _with_pr_number().where(TestResultRow.test_id == test_id)
        .order_by(TestResultRow.recorded_at.desc(), TestResultRow.id.desc()).limit(limit)
    )
    return _views(session, stmt)


@dataclasses.dataclass(frozen=True)
class FailingStreak:
    """A test whose newest counted result on a backend fails: the streak of failures up to now."""

    backend: str
    test_id: str
    first: TestResultView  # where the streak started (within the window and the walk's bound)
    last: TestResultView
    failures_in_a_row: int


def failing_now(
    session: Session, *, since: dt.datetime, backend: str | None, after: tuple[str, str] | None, limit: int,
    streak_limit: int,
) -> tuple[list[FailingStreak], tuple[str, str] | None]:
    """Tests failing now, in (backend, test id) order after the cursor ``after``: at most ``limit``
    streaks, and the cursor of the next page (None at the end).

    Bounded whatever the number of results: at most ``2 * limit`` candidates are looked at (each
    outcome's failures read in index order from the cursor), and each candidate's newest
    ``streak_limit`` counted results (a longer streak is reported as ``streak_limit`` in a row).
    """
    scan = 2 * limit
    keys: set[tuple[str, str]] = set()
    for outcome in FAILING_OUTCOMES:
        stmt = select(TestResultRow.backend, TestResultRow.test_id).where(
            TestResultRow.outcome == outcome, TestResultRow.recorded_at >= since)
        if backend is not None:
            stmt = stmt.where(TestResultRow.backend == backend)
        if after is not None:
            stmt = stmt.where(or_(TestResultRow.backend > after[0],
                                  and_(TestResultRow.backend == after[0], TestResultRow.test_id > after[1])))
        stmt = stmt.group_by(TestResultRow.backend, TestResultRow.test_id).order_by(
            TestResultRow.backend, TestResultRow.test_id).limit(scan)
        keys.update((b, t) for b, t in session.execute(stmt))
    candidates = sorted(keys)[:scan]
    streaks: list[FailingStreak] = []
    last_key: tuple[str, str] | None = None
    for key in candidates:
        if len(streaks) >= limit:
            break
        last_key = key
        newest = _views(session, _with_pr_number().where(
            TestResultRow.backend == key[0], TestResultRow.test_id == key[1], TestResultRow.recorded_at >= since,
            TestResultRow.outcome.not_in(_NOT_COUNTED),
        ).order_by(TestResultRow.recorded_at.desc(), TestResultRow.id.desc()).limit(streak_limit))
        streak = []
        for result in newest:
            if result.outcome not in FAILING_OUTCOMES:
                break
            streak.append(result)
        if streak:
            streaks.append(FailingStreak(key[0], key[1], first=streak[-1], last=streak[0], failures_in_a_row=len(streak)))
    more = len(streaks) >= limit or len(keys) >= scan
    return streaks, (last_key if more and last_key is not None else None)


@dataclasses.dataclass(frozen=True)
class FlakyEvidence:
    """One test that both passed and failed for one backend on one tested torch commit: the runs of each."""

    backend: str
    test_id: str
    torch_commit: str  # the torch the runs tested (the report's git_version, else the dispatched commit)
    passed_runs: tuple[int, ...]
    failed_runs: tuple[int, ...]
    last_seen: dt.datetime


def flaky(session: Session, when: dt.datetime, *, test_id: str | None = None, backend: str | None = None,
          limit: int = 200) -> list[FlakyEvidence]:
    """Tests with both a pass and a failure for one backend and one tested torch commit since ``when``,
    most recently seen first, at most ``limit``."""
    commit = func.coalesce(RunRow.torch_git_version, TestResultRow.head_sha)
    where = [TestResultRow.recorded_at >= when, TestResultRow.outcome.in_(("passed", *FAILING_OUTCOMES))]
    if test_id is not None:
        where.append(TestResultRow.test_id == test_id)
    if backend is not None:
        where.append(TestResultRow.backend == backend)
    passed = func.sum(case((TestResultRow.outcome == "passed", 1), else_=0))
    groups = (
        select(TestResultRow.backend, TestResultRow.test_id, commit.label("commit"),
               func.max(TestResultRow.recorded_at).label("last_seen"))
        .join(RunRow, _VISIBLE).where(*where)
        .group_by(TestResultRow.backend, TestResultRow.test_id, commit)
        .having(passed > 0, passed < func.count())
        .order_by(func.max(TestResultRow.recorded_at).desc()).limit(limit).subquery()
    )
    rows = session.execute(
        select(groups.c.backend, groups.c.test_id, groups.c.commit, groups.c.last_seen, TestResultRow.outcome,
               TestResultRow.run_pk)
        .join(RunRow, _VISIBLE)
        .join(groups, and_(groups.c.backend == TestResultRow.backend, groups.c.test_id == TestResultRow.test_id,
                           groups.c.commit == commit))
        .where(*where).order_by(groups.c.last_seen.desc(), TestResultRow.id)
    )
    found: dict[tuple[str, str, str], tuple[list[int], list[int], dt.datetime]] = {}
    for backend_name, test, torch_commit, last_seen, outcome, run_pk in rows:
        ok, bad, _ = found.setdefault((backend_name, test, torch_commit), ([], [], last_seen))
        (ok if outcome == "passed" else bad).append(run_pk)
    return [FlakyEvidence(b, t, c, tuple(dict.fromkeys(ok)), tuple(dict.fromkeys(bad)), seen)
            for (b, t, c), (ok, bad, seen) in found.items()]


def _like(glob: str) -> str:
    """A descriptor pattern (``*`` = any run of characters, the rest literal) as a LIKE pattern (escape ``\\``)."""
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def newest_matching(session: Session, backend: str, pattern: str, *, since: dt.datetime, per_test: int,
                    max_tests: int) -> dict[str, list[TestResultView]]:
    """For each test of ``backend`` whose id matches ``pattern`` (a quarantine entry's ``match``) with a
    result since ``since``: its newest ``per_test`` counted results (skips and xfails say nothing), newest
    first. At most ``max_tests`` tests, in id order. LIKE is case-insensitive on SQLite: the caller
    compares ids with the pattern itself too."""
    ids = session.scalars(
        select(TestResultRow.test_id).join(RunRow, _VISIBLE).where(
            TestResultRow.backend == backend, TestResultRow.recorded_at >= since,
            TestResultRow.test_id.like(_like(pattern), escape="\\"),
        ).distinct().order_by(TestResultRow.test_id).limit(max_tests)
    ).all()
    return {
        test_id: _views(session, _with_pr_number().where(
            TestResultRow.backend == backend, TestResultRow.test_id == test_id,
            TestResultRow.outcome.not_in(_NOT_COUNTED),
        ).order_by(TestResultRow.recorded_at.desc(), TestResultRow.id.desc()).limit(per_test))
        for test_id in ids
    }
