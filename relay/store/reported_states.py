"""Reported states: the last state reported upstream per (run, target), so reporting skips repeats.

Written by reporting after each successful (or permanently failed) GitHub write; read by reporting
before each write. ``target`` names where the state went (``check_run`` or ``status``);
``external_id`` keeps the check run's id so later states update the same check run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, PrimaryKeyConstraint, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["ReportedState", "ReportedStateRow"]

_ID = BigInteger().with_variant(Integer, "sqlite")


class ReportedStateRow(Base):
    __tablename__ = "reported_states"
    __table_args__ = (PrimaryKeyConstraint("run_pk", "target", name="pk_reported_states"),)

    run_pk: Mapped[int] = mapped_column(_ID, ForeignKey("runs.id"))
    target: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(200))
    external_id: Mapped[int | None] = mapped_column(BigInteger)
    last_error: Mapped[str | None] = mapped_column(Text)
    reported_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class ReportedState:
    run_pk: int
    target: str
    state: str
    external_id: int | None
    last_error: str | None
    reported_at: dt.datetime


def _view(row: ReportedStateRow) -> ReportedState:
    return ReportedState(row.run_pk, row.target, row.state, row.external_id, row.last_error, row.reported_at)


def get(session: Session, run_pk: int, target: str) -> ReportedState | None:
    row = session.get(ReportedStateRow, (run_pk, target))
    return None if row is None else _view(row)


def put(
    session: Session, run_pk: int, target: str, state: str, *, external_id: int | None, last_error: str | None,
    now: dt.datetime,
) -> None:
    row = session.get(ReportedStateRow, (run_pk, target), with_for_update=True)
    if row is None:
        session.add(ReportedStateRow(
            run_pk=run_pk, target=target, state=state, external_id=external_id, last_error=last_error, reported_at=now,
        ))
        return
    row.state, row.last_error, row.reported_at = state, last_error, now
    if external_id is not None:
        row.external_id = external_id


def for_runs(session: Session, run_pks: list[int]) -> list[ReportedState]:
    if not run_pks:
        return []
    return [_view(row) for row in session.scalars(select(ReportedStateRow).where(ReportedStateRow.run_pk.in_(run_pks)))]
