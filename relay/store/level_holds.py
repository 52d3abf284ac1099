"""Level holds: a backend found below its level's hold bar, since when, why, and how it ended.

Written by the level watch (``relay.levels.watch``: opens a hold when a backend's level review falls
below a ``hold`` criterion of its level, notes when it is back above, ends it after the configured
time above), by ``relay levels restore`` (a person ends it) and by a descriptor reload that changes the
backend's level. Read by reporting through the trust module (a backend at a blocking level reports
non-blocking while a hold is active), by the dashboard (``/backends/{name}``, ``/api/backends/{name}``)
and by anything that asks "below its bar since when" (``Store.current_level_hold``).

At most one hold per backend is active (``ended_at`` null); ended holds are kept as the history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import BigInteger, DateTime, Index, Integer, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.backends import BackendRow
from relay.store.base import Base

__all__ = ["RECOVERED", "LevelHold", "LevelHoldRow"]

_ID = BigInteger().with_variant(Integer, "sqlite")
RECOVERED = "recovered"  # ended_by of a hold the watch ended: back above its bar for the configured time


class LevelHoldRow(Base):
    __tablename__ = "level_holds"
    __table_args__ = (Index("ix_level_holds_backend_ended", "backend", "ended_at"),)

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    backend: Mapped[str] = mapped_column(String(100))
    level: Mapped[str] = mapped_column(String(4))  # the level it was below the bar of
    reason: Mapped[str] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime)
    above_since: Mapped[dt.datetime | None] = mapped_column(DateTime)  # back above its bar since (None: not)
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    ended_by: Mapped[str | None] = mapped_column(String(300))


@dataclasses.dataclass(frozen=True)
class LevelHold:
    """One hold. ``ended_by``: ``recovered`` (the watch), ``restored: <reason>`` (a person, with
    ``relay levels restore``) or ``level changed: L4 -> L3`` (a descriptor reload)."""

    id: int
    backend: str
    level: str
    reason: str
    started_at: dt.datetime
    above_since: dt.datetime | None
    ended_at: dt.datetime | None
    ended_by: str | None

    @property
    def active(self) -> bool:
        return self.ended_at is None

    @property
    def ended_by_person(self) -> bool:
        """Ended by a person's decision (a restore or a level change), not by the backend recovering."""
        return self.ended_at is not None and self.ended_by != RECOVERED


def _view(row: LevelHoldRow) -> LevelHold:
    return LevelHold(row.id, row.backend, row.level, row.reason, row.started_at, row.above_since, row.ended_at,
                     row.ended_by)


def _active_row(session: Session, backend: str, *, lock: bool = False) -> LevelHoldRow | None:
    stmt = select(LevelHoldRow).where(LevelHoldRow.backend == backend, LevelHoldRow.ended_at.is_(None))
    if lock:
        stmt = stmt.with_for_update()
    return session.scalars(stmt.order_by(LevelHoldRow.id.desc()).limit(1)).first()


def current(session: Session, backend: str) -> LevelHold | None:
    row = _active_row(session, backend)
    return None if row is None else _view(row)


def history(session: Session, backend: str, limit: int) -> list[LevelHold]:
    stmt = select(LevelHoldRow).where(LevelHoldRow.backend == backend).order_by(LevelHoldRow.id.desc()).limit(limit)
    return [_view(row) for row in session.scalars(stmt)]


def start(session: Session, backend: str, level: str, reason: str, now: dt.datetime) -> LevelHold:
    """Open a hold unless one is active (then that one is returned, and marked below its bar again)."""
    # The backend's row serialises processes opening a hold for it (PostgreSQL row lock; SQLite's write lock).
    session.scalars(select(BackendRow.name).where(BackendRow.name == backend).with_for_update()).first()
    row = _active_row(session, backend, lock=True)
    if row is None:
        row = LevelHoldRow(backend=backend, level=level, reason=reason[:4000], started_at=now)
        session.add(row)
        session.flush()
    else:
        row.above_since = None
    return _view(row)


def mark_above(session: Session, backend: str, now: dt.datetime) -> LevelHold | None:
    """Note that the active hold's backend meets its bar (from ``now`` unless already noted)."""
    row = _active_row(session, backend, lock=True)
    if row is None:
        return None
    if row.above_since is None:
        row.above_since = now
    return _view(row)


def end(session: Session, backend: str, ended_by: str, now: dt.datetime) -> LevelHold | None:
    """End the active hold (None when there is none)."""
    row = _active_row(session, backend, lock=True)
    if row is None:
        return None
    row.ended_at, row.ended_by = now, ended_by[:300]
    return _view(row)
