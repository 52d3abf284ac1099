"""Quarantine: rows a background pass could not handle, each with its error, set aside so the pass
goes on with every other row.

Written by the store's row-by-row work (the run a sent dispatch starts, time-outs, re-run requests) when handling one row
raises; read by those passes (a quarantined row is skipped), by ``/api/quarantine``, by ``/metrics``
(``relay_quarantined_rows``) and by ``/readyz``. A row leaves quarantine when an operator fixes it and
deletes the entry (``Store.release_quarantined``); nothing retries it by itself, since the same row
would fail the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy import DateTime, String, Text, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["QuarantinedRow", "QuarantineView", "add", "counts", "each_row", "keys", "list_views", "release"]

log = logging.getLogger("relay.store")

Item = TypeVar("Item")
Result = TypeVar("Result")


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
    if session.get(QuarantinedRow, (worker, subject)) is not None:
        return
    try:
        with session.begin_nested():
            session.add(QuarantinedRow(worker=worker, subject=subject, error=error[:4000], quarantined_at=now))
    except IntegrityError:  # another pass (another thread, another replica) set the same row aside first
        pass


def each_row(
    session: Session, worker: str, items: Iterable[tuple[str, Item]], handle: Callable[[Item], Result], now: dt.datetime,
) -> list[Result]:
    """Run ``handle(item)`` for each ``(subject, item)`` in a savepoint of its own, skipping subjects
    already quarantined; one that raises is rolled back alone and quarantined with its error."""
    skipped = keys(session, worker)
    results = []
    for subject, item in items:
        if subject in skipped:
            continue
        try:
            with session.begin_nested():
                result = handle(item)
        except Exception as exc:  # noqa: BLE001 - whatever this row does, the other rows go on
            error = f"{type(exc).__name__}: {exc}"
            log.error("row quarantined", extra={"worker": worker, "subject": subject, "error": error})
            add(session, worker, subject, error, now)
            continue
        results.append(result)
    return results


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
