"""Test results: one row per conformance test of a completed run (suite, test id, outcome, duration, message).

Written by a ``completed`` callback, in the transaction that finishes the run. Read by the dashboard
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
    BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, and_, case, func, insert, select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base
from relay.store.runs import RunRow

__all__ = ["FAILING_OUTCOMES", "FlakyEvidence", "NewTestResult", "TestResultRow", "TestResultView", "test_id_of"]

_ID = BigInteger().with_variant(Integer, "sqlite")
MESSAGE_MAX_CHARS = 4000
FAILING_OUTCOMES = ("failed", "error", "xpassed")


class TestResultRow(Base):
    __tablename__ = "test_results"
    __table_args__ = (
        Index("ix_test_results_test_backend", "test_id", "backend"),
        Index("ix_test_results_run", "run_pk"),
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


def add_many(session: Session, run: RunRow, results: Iterable[NewTestResult], now: dt.datetime) -> int:
    """Insert ``results`` for ``run`` in chunks of CHUNK_ROWS, inside the caller's transaction; returns how many."""
    recorded, chunk = 0, []
    for r in results:
        chunk.append({
            "run_pk": run.id, "backend": run.backend, "head_sha": run.head_sha, "suite": r.suite[:200],
            "test_id": test_id_of(r.suite, r.nodeid), "nodeid": r.nodeid, "outcome": r.outcome,
            "duration": r.duration, "message": r.message[:MESSAGE_MAX_CHARS], "recorded_at": now,
        })
        if len(chunk) == CHUNK_ROWS:
            session.execute(insert(TestResultRow), chunk)
            recorded, chunk = recorded + len(chunk), []
    if chunk:
        session.execute(insert(TestResultRow), chunk)
        recorded += len(chunk)
    return recorded


def _with_pr_number():
    """Results joined to their run, for the PR number each view carries."""
    return select(TestResultRow, RunRow.pr_number).join(RunRow, RunRow.id == TestResultRow.run_pk)


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


def since(session: Session, when: dt.datetime, backend: str | None = None) -> list[TestResultView]:
    """Every result recorded after ``when``, oldest first (for streak analysis)."""
    stmt = _with_pr_number().where(TestResultRow.recorded_at >= when)
    if backend is not None:
        stmt = stmt.where(TestResultRow.backend == backend)
    return _views(session, stmt.order_by(TestResultRow.recorded_at, TestResultRow.id))


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
        .join(RunRow, RunRow.id == TestResultRow.run_pk).where(*where)
        .group_by(TestResultRow.backend, TestResultRow.test_id, commit)
        .having(passed > 0, passed < func.count())
        .order_by(func.max(TestResultRow.recorded_at).desc()).limit(limit).subquery()
    )
    rows = session.execute(
        select(groups.c.backend, groups.c.test_id, groups.c.commit, groups.c.last_seen, TestResultRow.outcome,
               TestResultRow.run_pk)
        .join(RunRow, RunRow.id == TestResultRow.run_pk)
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
