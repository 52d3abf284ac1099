"""Result batches: the test results of one ``completed`` callback while they are being written.

A report may carry tens of thousands of tests. Its results are written in chunks, each chunk in a
transaction of its own, so that intake's writes (which on SQLite share one write lock with every
other write) go in between; the run's final transition then commits the batch in one short
transaction: it sets ``runs.results_batch`` to the batch's id and deletes the batch's row here.

A result row is visible only when its ``batch`` equals its run's ``results_batch`` (every read in
``per_test_results`` joins that way), so a crash, a time-out or a refused transition between the
chunks and the final transition leaves nothing half-visible. Results written before batches existed
carry batch 0, as their runs do.

Written by callbacks (``open_batch``, ``write_chunk``; ``commit`` in the run's final transition;
``discard`` when the transition is refused). Read and cleaned by the sweeper (``orphans``): a batch
whose run is final with another batch (the callback was retried and the retry won, a concurrent
completion won, or the run timed out first) is deleted chunk by chunk. A batch of a run that is
still open is never touched: its callback may still be writing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, delete, insert, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.run_states import FINAL_STATES, TransitionRefused
from relay.store.base import Base
from relay.store.per_test_results import CHUNK_ROWS, NewTestResult, TestResultRow, rows_of
from relay.store.runs import RunRow

__all__ = ["BatchGone", "OpenBatch", "ResultBatchRow", "commit", "discard_chunk", "open_batch", "orphans", "write_chunk"]

_ID = BigInteger().with_variant(Integer, "sqlite")
_FINAL = tuple(s.value for s in FINAL_STATES)


class BatchGone(TransitionRefused):
    """The batch was discarded while its callback was still writing it: its run became final meanwhile
    (timed out, or another completion won), so this completion is refused like any on a finished run."""

    def __init__(self, batch: int, run: RunRow):
        super().__init__(
            "run_finished_meanwhile",
            f"run {run.id} ({run.backend}) became {run.state} while this report was being stored; "
            f"its results (batch {batch}) were discarded and a finished run is not changed",
        )


@dataclasses.dataclass(frozen=True)
class OpenBatch:
    id: int
    run_pk: int
    opened_at: dt.datetime  # every result of the batch is recorded at this time


class ResultBatchRow(Base):
    __tablename__ = "result_batches"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_pk: Mapped[int] = mapped_column(_ID, ForeignKey("runs.id"), index=True)
    opened_at: Mapped[dt.datetime] = mapped_column(DateTime)


def open_batch(session: Session, run: RunRow, now: dt.datetime) -> int:
    row = ResultBatchRow(run_pk=run.id, opened_at=now)
    session.add(row)
    session.flush()
    return row.id


def write_chunk(session: Session, batch: int, run: RunRow, results: Sequence[NewTestResult], now: dt.datetime) -> None:
    """Insert one chunk (at most CHUNK_ROWS) of ``batch``; raises :class:`BatchGone` if it was discarded.

    The batch row is read under a share lock, so the sweeper cannot discard it mid-chunk (PostgreSQL;
    SQLite writes one transaction at a time anyway)."""
    if session.scalar(select(ResultBatchRow.id).where(ResultBatchRow.id == batch).with_for_update(read=True)) is None:
        raise BatchGone(batch, run)
    session.execute(insert(TestResultRow), rows_of(run, results, now, batch=batch))


def commit(session: Session, batch: int, run: RunRow) -> None:
    """Make ``batch`` the run's results (inside the run's final transition)."""
    row = session.get(ResultBatchRow, batch, with_for_update=True)
    if row is None or row.run_pk != run.id:
        raise BatchGone(batch, run)
    run.results_batch = batch
    session.execute(delete(ResultBatchRow).where(ResultBatchRow.id == batch))


def discard_chunk(session: Session, batch: int, run_pk: int) -> bool:
    """Delete up to CHUNK_ROWS results of ``batch``; when none are left, the batch row too. True when done."""
    ids = select(TestResultRow.id).where(TestResultRow.run_pk == run_pk, TestResultRow.batch == batch).limit(CHUNK_ROWS)
    if session.execute(delete(TestResultRow).where(TestResultRow.id.in_(ids.scalar_subquery()))).rowcount:
        return False
    session.execute(delete(ResultBatchRow).where(ResultBatchRow.id == batch))
    return True


def orphans(session: Session, limit: int) -> list[tuple[int, int]]:
    """(batch, run) of batches that can never be committed: their run is final."""
    return [tuple(row) for row in session.execute(
        select(ResultBatchRow.id, ResultBatchRow.run_pk).join(RunRow, RunRow.id == ResultBatchRow.run_pk)
        .where(RunRow.state.in_(_FINAL)).order_by(ResultBatchRow.id).limit(limit)
    )]
