"""Store probes: one row that ``/readyz`` rewrites, so health means "the store can be written", not
merely "the store answers a SELECT" (a full disk or a held write lock still answers reads).

Written by ``Store.probe`` on every health check; read by nothing else.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import DateTime, String, insert, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["StoreProbe", "write"]

_NAME = "health"


class StoreProbe(Base):
    __tablename__ = "store_probes"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    written_at: Mapped[dt.datetime] = mapped_column(DateTime)


def write(session: Session, now: dt.datetime) -> None:
    """Rewrite the probe row (inserting it the first time): a real write, fsynced at commit."""
    updated = session.execute(update(StoreProbe).where(StoreProbe.name == _NAME).values(written_at=now))
    if updated.rowcount == 0:
        session.execute(insert(StoreProbe).values(name=_NAME, written_at=now))
