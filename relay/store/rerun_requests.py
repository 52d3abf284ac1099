"""Re-run requests: which stored ``check_run``/``check_suite``/``issue_comment`` deliveries re-runs handled.

Intake stores those webhooks (with their payload); the re-run watcher reads the unhandled ones, and
writes one row per delivery saying what it did (``dispatched`` with the backends, or ``ignored`` with
the reason) together with the new outbox rows, in one transaction, so each request acts once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection

from sqlalchemy import JSON, DateTime, ForeignKey, String, Text, exists, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base
from relay.store.deliveries import Delivery, DeliveryView, get

__all__ = ["RERUNS", "RerunRequestRow", "RerunRequestView"]

RERUNS = "re-runs"  # the quarantine's name for the re-run watcher (subjects: "delivery <id>")

RERUN_EVENTS = ("check_run", "check_suite", "issue_comment")


class RerunRequestRow(Base):
    __tablename__ = "rerun_requests"

    delivery_id: Mapped[str] = mapped_column(String(100), ForeignKey("deliveries.delivery_id"), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    backends: Mapped[list[str]] = mapped_column(JSON)
    handled_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class RerunRequestView:
    delivery_id: str
    outcome: str
    reason: str | None
    backends: tuple[str, ...]
    handled_at: dt.datetime


def unhandled(session: Session, limit: int, skip: Collection[str] = ()) -> list[DeliveryView]:
    query = select(Delivery).where(
        Delivery.event.in_(RERUN_EVENTS), Delivery.payload.is_not(None),
        ~exists().where(RerunRequestRow.delivery_id == Delivery.delivery_id),
    )
    if skip:
        query = query.where(Delivery.delivery_id.not_in(list(skip)))
    rows = session.scalars(query.order_by(Delivery.received_at).limit(limit)).all()
    # The rows are in the session now: ``get`` finds each in its identity map, without another query.
    return [get(session, row.delivery_id) for row in rows]


def is_handled(session: Session, delivery_id: str) -> bool:
    return session.get(RerunRequestRow, delivery_id) is not None


def add(session: Session, delivery_id: str, outcome: str, reason: str | None, backends: list[str], now: dt.datetime) -> None:
    session.add(RerunRequestRow(delivery_id=delivery_id, outcome=outcome, reason=reason, backends=backends, handled_at=now))


def get_view(session: Session, delivery_id: str) -> RerunRequestView | None:
    row = session.get(RerunRequestRow, delivery_id)
    if row is None:
        return None
    return RerunRequestView(row.delivery_id, row.outcome, row.reason, tuple(row.backends), row.handled_at)
