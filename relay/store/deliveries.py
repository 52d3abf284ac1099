"""Deliveries: one row per accepted webhook, keyed by ``X-GitHub-Delivery`` (the dedupe key).

Written by intake (through the store's group commit: ``insert_new`` for a whole batch of webhooks) in
the same transaction as the deliveries' dispatches; read to answer "was this delivery seen?" and, by the results side, for stored events
(``issue_comment``, ``check_run``, ``check_suite``: re-run requests).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Connection, DateTime, Index, String, Text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["Delivery", "DeliveryView", "NewDelivery"]


class Delivery(Base):
    __tablename__ = "deliveries"
    __table_args__ = (
        Index("ux_deliveries_body_sha256", "body_sha256", unique=True),
        # The re-run watcher's poll reads the re-run events only (check_run, check_suite, issue_comment).
        Index("ix_deliveries_event_received_at", "event", "received_at"),
    )

    delivery_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    event: Mapped[str] = mapped_column(String(64))
    action: Mapped[str | None] = mapped_column(String(64))
    repository: Mapped[str] = mapped_column(String(200))
    received_at: Mapped[dt.datetime] = mapped_column(DateTime, index=True)
    # "dispatched" (fan-out queued), "recorded" (nothing to send), "stored" (kept for the results side)
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The raw webhook, kept only for events the results side reads later (re-run requests).
    payload: Mapped[str | None] = mapped_column(Text)
    # sha256 of the signed body: the signature does not cover X-GitHub-Delivery, so a replayed body
    # under a fresh delivery id is recognised by this (unique) digest. NULL for rows stored before it.
    body_sha256: Mapped[str | None] = mapped_column(String(64))


@dataclasses.dataclass(frozen=True)
class NewDelivery:
    delivery_id: str
    event: str
    action: str | None
    repository: str
    outcome: str
    summary: dict[str, Any]
    reason: str | None = None
    payload: str | None = None
    body_sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class DeliveryView:
    delivery_id: str
    event: str
    action: str | None
    repository: str
    received_at: dt.datetime
    outcome: str
    reason: str | None
    summary: dict[str, Any]
    payload: str | None


def insert_new(connection: Connection, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Insert the rows whose ``delivery_id`` and ``body_sha256`` are not in the table yet; return the ids inserted.

    ``ON CONFLICT DO NOTHING`` (on either unique key) makes the database the judge of "seen before",
    so two copies of one delivery racing in two processes (PostgreSQL) still store one: the second
    waits for the first's transaction and then skips. The same holds for one signed body replayed
    under several delivery ids. Callers pass rows sorted by id, so two batches lock keys in one order.
    """
    if not rows:
        return set()
    return set(connection.execute(_insert_new_statement(connection.dialect.name), list(rows)).scalars())


def forget_old_digests(connection: Connection, digests: Sequence[str], received_before: dt.datetime) -> None:
    """Stop judging replays by the bodies of ``digests`` stored before ``received_before`` (outside the
    replay window): their rows keep everything else, and a body seen again is a new delivery."""
    if digests:
        connection.execute(update(Delivery).where(
            Delivery.body_sha256.in_(list(digests)), Delivery.received_at < received_before).values(body_sha256=None))


@functools.cache
def _insert_new_statement(dialect_name: str):
    # Built once per dialect: constructing the statement costs more than running it for a small batch.
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(Delivery).on_conflict_do_nothing().returning(Delivery.delivery_id)


def get(session: Session, delivery_id: str) -> DeliveryView | None:
    row = session.get(Delivery, delivery_id)
    if row is None:
        return None
    return DeliveryView(
        delivery_id=row.delivery_id, event=row.event, action=row.action, repository=row.repository,
        received_at=row.received_at, outcome=row.outcome, reason=row.reason, summary=row.summary,
        payload=row.payload,
    )
