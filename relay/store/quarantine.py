"""Quarantine: rows a background pass could not handle, each with its error, set aside so the pass
goes on with every other row.

Written by the store's row-by-row passes (adoption, time-outs, re-run requests) when handling one row
raises; read by those passes (a quarantined row is skipped), by ``/api/quarantine``, by ``/metrics``
(``relay_quarantined_rows``) and by ``/healthz``. A row leaves quarantine when an operator fixes it and
deletes the entry (``Store.release_quarantined``); nothing retries it by itself, since the same row
would fail the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import DateTime, Integer, String, Text, delete, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["QuarantinedRow", "QuarantineView", "add", "counts", "keys", "list_views", "release"]


class QuarantinedRow(Base):
    __tablename__ = "quarantine"

    worker: Mapped[str] = mapped_column(String(50), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    error: Mapped[str] = mapped_column(Text)
    quarantined_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class QuarantineView:
    worker: str
    subject: str
    error: str
    quarantined_at: dt.datetime


def add(session: Session, worker: str, subject: str, error: str, now: dt.datetime) -> None:
    if session.get(QuarantinedRow, (worker, subject)) is None:
        session.add(QuarantinedRow(worker=worker, subject=subject, error=error[:4000], quarantined_at=now))


def keys(session: Session, worker: str) -> set[str]:
    return set(session.scalars(select(QuarantinedRow.subject).where(QuarantinedRow.worker == worker)))


def counts(session: Session) -> dict[str, int]:
    return dict(session.execute(select(QuarantinedRow.worker, func.count()).group_by(QuarantinedRow.worker)).all())


def list_views(session: Session, limit: int) -> list[QuarantineView]:
    rows = session.scalars(select(QuarantinedRow).order_by(QuarantinedRow.quarantined_at.desc()).limit(limit))
    return [QuarantineView(r.worker, r.subject, r.error, r.quarantined_at) for r in rows]


def release(session: Session, worker: str, subject: str) -> bool:
    return session.execute(
        delete(QuarantinedRow).where(QuarantinedRow.worker == worker, QuarantinedRow.subject == subject)
    ).rowcount == 1
