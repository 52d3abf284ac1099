"""Credential gates: per GitHub credential, the rest GitHub ordered, a pause after it refused the
credential, and the pacing bucket, kept in the database so every relay process on it shares them.

Written by the dispatcher (``take`` before each call, ``rest`` after a rate-limit answer, ``pause`` after
a 401, ``resume`` after a call that succeeded); read by its claims (credentials that may not send now),
by ``/metrics`` and ``/healthz``. The row of a credential is locked while it is read and changed, so two
processes never spend the same token.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import Boolean, DateTime, Float, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["CredentialGateRow", "GateView"]


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


def views(session: Session) -> list[GateView]:
    return [GateView(r.credential, r.resting_until, r.paused, r.reason)
            for r in session.scalars(select(CredentialGateRow).order_by(CredentialGateRow.credential))]
