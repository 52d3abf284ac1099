"""Worker leases: which relay process runs a worker that must run in one process at a time, across
every replica on the store (the level watch and the proposals pass: each acts on GitHub or records
holds from what every replica sees, so two copies race).

Written and read by ``relay.periodic.ReplicaLease`` through ``Store.take_worker_lease`` and
``Store.release_worker_lease``: one row per worker names its holder and when the lease ends. A pass
first takes or renews the lease (held by this process, or ended) and skips when another holds it; a
holder that dies lets the lease end within its length, one that stops hands it back at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import DateTime, String, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["LeaseView", "WorkerLeaseRow", "release", "take", "views"]

_ENDED = dt.datetime(1970, 1, 1)  # the end of a lease handed back


class WorkerLeaseRow(Base):
    __tablename__ = "worker_leases"

    worker: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class LeaseView:
    worker: str
    holder: str
    expires_at: dt.datetime


def take(session: Session, worker: str, holder: str, now: dt.datetime, seconds: float) -> bool:
    """Take or renew ``worker``'s lease for ``holder`` until ``now + seconds``; False while another
    holder's lease runs. One conditional UPDATE: on PostgreSQL a concurrent taker waits for the row and
    then finds it held; SQLite's BEGIN IMMEDIATE serialises the takers."""
    until = now + dt.timedelta(seconds=seconds)
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(dialect.insert(WorkerLeaseRow).values(worker=worker, holder=holder, expires_at=_ENDED)
                    .on_conflict_do_nothing())
    taken = session.execute(
        update(WorkerLeaseRow)
        .where(WorkerLeaseRow.worker == worker,
               or_(WorkerLeaseRow.holder == holder, WorkerLeaseRow.expires_at <= now))
        .values(holder=holder, expires_at=until))
    return taken.rowcount == 1


def release(session: Session, worker: str, holder: str) -> None:
    """End ``holder``'s lease on ``worker`` now (nothing when another holds it)."""
    session.execute(update(WorkerLeaseRow).where(WorkerLeaseRow.worker == worker, WorkerLeaseRow.holder == holder)
                    .values(expires_at=_ENDED))


def views(session: Session) -> list[LeaseView]:
    return [LeaseView(r.worker, r.holder, r.expires_at)
            for r in session.scalars(select(WorkerLeaseRow).order_by(WorkerLeaseRow.worker))]
