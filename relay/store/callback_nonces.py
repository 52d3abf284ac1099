"""Callback nonces: which dispatch a callback's nonce names, and which nonces have expired.

Each dispatch carries a random nonce in its ``client_payload`` (written by intake in the outbox row);
a callback must quote it. Read by callbacks (``find``); written by the sweeper (``expire``: nonces of
dispatches sent longer ago than the nonce lifetime are recorded as expired and refused from then on).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, exists, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base
from relay.store.dispatches import Dispatch, DispatchState

__all__ = ["ExpiredNonceRow", "NonceTarget"]

_ID = BigInteger().with_variant(Integer, "sqlite")


class ExpiredNonceRow(Base):
    __tablename__ = "expired_nonces"

    dispatch_id: Mapped[int] = mapped_column(_ID, ForeignKey("dispatches.id"), primary_key=True, autoincrement=False)
    expired_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class NonceTarget:
    """The dispatch a nonce belongs to, as a callback needs it."""

    dispatch_id: int
    delivery_id: str
    backend: str
    repository: str
    client_payload: dict[str, Any]
    state: str
    sent_at: dt.datetime | None
    expired_at: dt.datetime | None


def find(session: Session, nonce: str) -> NonceTarget | None:
    row = session.scalar(select(Dispatch).where(Dispatch.nonce == nonce))
    if row is None:
        return None
    expired = session.get(ExpiredNonceRow, row.id)
    return NonceTarget(
        dispatch_id=row.id, delivery_id=row.delivery_id, backend=row.backend, repository=row.repository,
        client_payload=row.client_payload, state=row.state, sent_at=row.sent_at,
        expired_at=None if expired is None else expired.expired_at,
    )


def expire(session: Session, sent_before: dt.datetime, now: dt.datetime) -> int:
    """Record as expired every nonce of a dispatch sent before ``sent_before``; returns how many."""
    ids = session.scalars(
        select(Dispatch.id).where(
            Dispatch.state == DispatchState.sent, Dispatch.sent_at < sent_before,
            ~exists().where(ExpiredNonceRow.dispatch_id == Dispatch.id),
        )
    ).all()
    session.add_all(ExpiredNonceRow(dispatch_id=i, expired_at=now) for i in ids)
    return len(ids)
