"""Store probes: one row that ``/readyz`` rewrites, so health means "the store can be written", not
merely "the store answers a SELECT" (a full disk or a held write lock still answers reads). On
PostgreSQL the probe also takes the lock intake's inserts take on the intake tables: a lock held on
``deliveries`` (a migration, a person's ``LOCK TABLE``) stalls every webhook, and health must say so.

Written by ``Store.probe`` on every health check; read by nothing else.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import DateTime, String, insert, text, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["StoreProbe", "write"]

_NAME = "health"
# Intake's tables, in the order intake writes them. ROW EXCLUSIVE is what an INSERT takes: it waits only
# behind the locks that would stall intake (SHARE and stronger), never behind other writers.
INTAKE_TABLES = ("deliveries", "dispatches", "pull_requests")


class StoreProbe(Base):
    __tablename__ = "store_probes"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    written_at: Mapped[dt.datetime] = mapped_column(DateTime)


def write(session: Session, now: dt.datetime) -> None:
    """Rewrite the probe row (inserting it the first time): a real write, fsynced at commit; on
    PostgreSQL first the intake tables' insert lock (SQLite's write lock is the database's, which the
    probe's write takes anyway)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"LOCK TABLE {', '.join(INTAKE_TABLES)} IN ROW EXCLUSIVE MODE"))
    updated = session.execute(update(StoreProbe).where(StoreProbe.name == _NAME).values(written_at=now))
    if updated.rowcount == 0:
        session.execute(insert(StoreProbe).values(name=_NAME, written_at=now))
