"""Credential gates: per GitHub credential, the rest GitHub ordered, a pause after it refused the
credential, and the pacing bucket, kept in the database so every relay process on it shares them.

Written by the dispatcher (``take`` before each call, ``rest`` after a rate-limit answer or, paused, after
a 401, ``resume`` after a paused credential's call succeeded); read by its claims (credentials that may not send now),
by ``/metrics`` and ``/readyz``. The row of a credential is locked while it is read and changed, so two
processes never spend the same token.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys

from sqlalchemy import Boolean, DateTime, Float, String, Text, bindparam, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["CredentialGateRow", "GateView", "allowances", "next_rest_end", "rest", "resume", "take", "views"]


class CredentialGateRow(Base):
    __tablename__ = "credential_gates"

    credential: Mapped[str] = mapped_column(String(200), primary_key=True)
    resting_until: Mapped[dt.datetime | None] = mapped_column(DateTime)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[float] = mapped_column(Float)
    tokens_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class GateView:
    credential: str
    resting_until: dt.datetime | None
    paused: bool
    reason: str | None


# Read on every pass of the dispatcher: built once, with bound parameters (as dispatches' claim statements).
_GATES_OF = select(CredentialGateRow).where(CredentialGateRow.credential.in_(bindparam("credentials", expanding=True)))
_NEXT_REST_END = select(func.min(CredentialGateRow.resting_until)).where(CredentialGateRow.resting_until > bindparam("now"))


def views(session: Session) -> list[GateView]:
    return [GateView(r.credential, r.resting_until, r.paused, r.reason)
            for r in session.scalars(select(CredentialGateRow).order_by(CredentialGateRow.credential))]


def _ensure(session: Session, credential: str, now: dt.datetime, capacity: float) -> CredentialGateRow:
    """The credential's row, locked (FOR UPDATE; SQLite's BEGIN IMMEDIATE already serialises), created full."""
    values = {"credential": credential, "paused": False, "tokens": capacity, "tokens_at": now}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    session.execute(dialect_insert(CredentialGateRow).values(**values).on_conflict_do_nothing())
    return session.scalars(
        select(CredentialGateRow).where(CredentialGateRow.credential == credential).with_for_update()
        .execution_options(populate_existing=True)
    ).one()


def _refilled(row: CredentialGateRow, now: dt.datetime, rate: float, capacity: float) -> float:
    elapsed = max((now - row.tokens_at).total_seconds(), 0.0)
    return min(capacity, row.tokens + elapsed * rate)


def allowances(session: Session, credentials: list[str], now: dt.datetime, rate: float, capacity: float) -> dict[str, int]:
    """Calls each credential may make now: 0 while it rests or is paused, else the whole tokens left
    (``rate`` 0: unpaced). A credential without a row has never been used: a full bucket."""
    rows = {r.credential: r for r in session.scalars(_GATES_OF, {"credentials": list(credentials)})}
    out = {}
    for credential in credentials:
        row = rows.get(credential)
        if row is not None and row.resting_until is not None and row.resting_until > now:
            out[credential] = 0
        elif rate <= 0:
            out[credential] = sys.maxsize
        else:
            out[credential] = int(capacity if row is None else _refilled(row, now, rate, capacity))
    return out


def take(session: Session, credential: str, now: dt.datetime, rate: float, capacity: float) -> tuple[float, bool]:
    """Reserve one call: (0, paused flag) when reserved, else (seconds to wait, paused flag)."""
    row = _ensure(session, credential, now, capacity)
    if row.resting_until is not None and row.resting_until > now:
        return (row.resting_until - now).total_seconds(), row.paused
    if rate <= 0:
        return 0.0, row.paused
    tokens = _refilled(row, now, rate, capacity)
    row.tokens_at = now
    if tokens < 1.0:
        row.tokens = tokens
        return (1.0 - tokens) / rate, row.paused
    row.tokens = tokens - 1.0
    return 0.0, row.paused


def rest(session: Session, credential: str, until: dt.datetime, now: dt.datetime, capacity: float,
         *, paused: bool = False, reason: str | None = None) -> None:
    """Rest ``credential`` until ``until`` (never shortening a longer rest); ``paused`` marks a refused credential."""
    row = _ensure(session, credential, now, capacity)
    if row.resting_until is None or row.resting_until < until:
        row.resting_until = until
    if paused:
        row.paused, row.reason = True, reason


def next_rest_end(session: Session, now: dt.datetime) -> dt.datetime | None:
    return session.scalar(_NEXT_REST_END, {"now": now})


def resume(session: Session, credential: str) -> None:
    """The credential worked again: no longer paused."""
    row = session.get(CredentialGateRow, credential, with_for_update=True)
    if row is not None and row.paused:
        row.paused, row.reason = False, None
