"""Dispatches: the outbox. One row per (delivery, backend) that must reach a downstream repository.

Written by intake (state ``queued``, in the delivery's transaction) and by the dispatcher (claims and
outcomes); read by the dispatcher, by ``/metrics`` (queue depth) and by tests. States:

    queued --claim--> sending --204--> sent
      ^                  |---retryable / rate limited---> queued (next_attempt_at later)
      |                  |---permanent or out of attempts--> failed
      +--lease expired---+ (the claiming process died: another claim picks the row up again; a process
                            on the same machine that knows the claimer dead ends the lease at once)

A claim sets ``claimed_by`` and ``claimed_until``; outcomes are written only by the process still
holding the claim, so a row is sent again only when its claimer vanished mid-request.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, Connection, DateTime, ForeignKey, Index, Integer, String, Text, UniqueConstraint, bindparam, func,
    insert, select, update,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["ClaimedDispatch", "Dispatch", "DispatchState", "DispatchView", "NewDispatch"]


# Advisory lock key space of per-backend claims (the second key is the backend name's hash).
_BACKEND_LOCK_SPACE = 0x6F7574  # "out"


class DispatchState:
    queued = "queued"
    sending = "sending"
    sent = "sent"
    failed = "failed"
    ALL = ("queued", "sending", "sent", "failed")


class Dispatch(Base):
    __tablename__ = "dispatches"
    __table_args__ = (
        UniqueConstraint("delivery_id", "backend", name="uq_dispatches_delivery_backend"),
        Index("ix_dispatches_due", "state", "next_attempt_at"),
        # A claim's lookups per lane: backends with queued rows, each one's oldest row, calls in flight.
        Index("ix_dispatches_state_backend", "state", "backend", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(100), ForeignKey("deliveries.delivery_id"))
    backend: Mapped[str] = mapped_column(String(100))
    repository: Mapped[str] = mapped_column(String(200))
    event_type: Mapped[str] = mapped_column(String(100))
    client_payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    nonce: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=DispatchState.queued)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_status: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(DateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_until: Mapped[dt.datetime | None] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class NewDispatch:
    backend: str
    repository: str
    event_type: str
    client_payload: dict[str, Any]
    nonce: str


@dataclasses.dataclass(frozen=True)
class ClaimedDispatch:
    """What a dispatcher needs to send one row (a snapshot, not a live ORM object)."""

    id: int
    delivery_id: str
    backend: str
    repository: str
    event_type: str
    client_payload: dict[str, Any]
    attempts: int
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class DispatchView:
    id: int
    delivery_id: str
    backend: str
    repository: str
    event_type: str
    client_payload: dict[str, Any]
    nonce: str
    state: str
    attempts: int
    last_error: str | None
    last_status: int | None
    created_at: dt.datetime
    updated_at: dt.datetime
    next_attempt_at: dt.datetime
    sent_at: dt.datetime | None
    claimed_by: str | None


def add(session: Session, delivery_id: str, new: NewDispatch, now: dt.datetime) -> None:
    """Queue one outbox row inside ``session``'s transaction (re-runs; intake goes through ``insert_rows``)."""
    insert_rows(session.connection(), [queued_row(delivery_id, new, now)])


def queued_row(delivery_id: str, new: NewDispatch, now: dt.datetime) -> dict[str, Any]:
    """The column values of a fresh outbox row (state queued, due at once)."""
    return {
        "delivery_id": delivery_id, "backend": new.backend, "repository": new.repository,
        "event_type": new.event_type, "client_payload": new.client_payload, "nonce": new.nonce,
        "state": DispatchState.queued, "attempts": 0, "created_at": now, "updated_at": now, "next_attempt_at": now,
    }


def insert_rows(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Queue outbox rows in one Core executemany (intake's hot path: no ORM unit of work).

    Rows go in the order given, so ids, and with them the per-backend send order, follow arrival.
    """
    if rows:
        connection.execute(insert(Dispatch), list(rows))


# The states a claim looks for, as conditions each lookup can use with its index. ``now`` is a time, or the
# bound parameter ``now`` of a statement built once (``_OLDEST_DUE_PER_LANE`` and the others below).
def _queued_due(now) -> tuple:
    return Dispatch.state == DispatchState.queued, Dispatch.next_attempt_at <= now


def _lease_ended(now) -> tuple:
    """A claim whose process died (or overran its lease): the row is due again."""
    return Dispatch.state == DispatchState.sending, Dispatch.claimed_until < now


def _in_flight(now) -> tuple:
    """A live claim: a call in flight in some process."""
    return Dispatch.state == DispatchState.sending, Dispatch.claimed_until >= now


def claim(
    session: Session, *, now: dt.datetime, claimer: str, lease_until: dt.datetime, limit: int,
    exclude_backends: Collection[str], max_claims: int | None = None,
) -> list[ClaimedDispatch]:
    """Claim the oldest due row of each backend not excluded and with no call in flight (a live
    ``sending`` row, whichever process holds it): one per backend keeps per-backend order.

    SQLite serialises claims (``BEGIN IMMEDIATE``), so what the query sees is what is claimed. On
    PostgreSQL several processes claim at once: each backend is claimed under a transaction-scoped
    advisory lock, taken without waiting (a backend another process is claiming right now is skipped),
    and its oldest due row is looked up again under that lock, after any claim committed before it.
    """
    chosen_ids = _oldest_due_per_backend(session, now, exclude_backends, limit)
    if max_claims is not None:
        chosen_ids = dict(sorted(chosen_ids.items(), key=lambda item: item[1])[:max_claims])
    if session.get_bind().dialect.name == "postgresql":
        chosen_ids = _lock_backends(session, chosen_ids, now)
    if not chosen_ids:
        return []
    chosen = session.scalars(
        select(Dispatch).where(Dispatch.id.in_(list(chosen_ids.values()))).order_by(Dispatch.id)
    ).all()
    claimed = []
    for row in chosen:
        row.state = DispatchState.sending
        row.claimed_by = claimer
        row.claimed_until = lease_until
        row.updated_at = now
        claimed.append(
            ClaimedDispatch(
                id=row.id, delivery_id=row.delivery_id, backend=row.backend, repository=row.repository,
                event_type=row.event_type, client_payload=row.client_payload, attempts=row.attempts,
                created_at=row.created_at,
            )
        )
    return claimed


def live_claimers(session: Session, now: dt.datetime) -> list[str]:
    """The claimers of every live claim (``sending``, lease not ended)."""
    return list(session.scalars(select(Dispatch.claimed_by).where(*_in_flight(now)).distinct()))


def end_claims(session: Session, claimer: str, now: dt.datetime) -> int:
    """End the leases of ``claimer``'s live claims now (its process is known dead): the rows are due
    at the next claim. Returns how many."""
    ended = session.execute(update(Dispatch).where(*_in_flight(now), Dispatch.claimed_by == claimer)
                            .values(claimed_until=now - dt.timedelta(microseconds=1)))
    return ended.rowcount


# The statements of every claim and of the dispatcher's idle wait, built once with the time as the bound
# parameter ``now``: built anew on each pass, their construction and cache keys cost more CPU than running them
# (the dispatcher runs a claim after every wake).
def _oldest_due_per_lane_statement():
    """(backend, its oldest due queued row or None) for each backend with queued rows."""
    queued = DispatchState.queued
    lanes_start = select(func.min(Dispatch.backend).label("backend")).where(Dispatch.state == queued)
    lanes = lanes_start.cte("lanes", recursive=True)
    lanes = lanes.union_all(
        select(select(func.min(Dispatch.backend)).where(Dispatch.state == queued, Dispatch.backend > lanes.c.backend)
               .scalar_subquery()).where(lanes.c.backend.is_not(None))
    )
    oldest = (select(Dispatch.id).where(*_queued_due(bindparam("now")), Dispatch.backend == lanes.c.backend)
              .order_by(Dispatch.id).limit(1).scalar_subquery())
    return select(lanes.c.backend, oldest).where(lanes.c.backend.is_not(None))


_OLDEST_DUE_PER_LANE = _oldest_due_per_lane_statement()
_LEASE_ENDED_ROWS = select(Dispatch.id, Dispatch.backend).where(*_lease_ended(bindparam("now")))
_IN_FLIGHT_BACKENDS = select(Dispatch.backend).where(*_in_flight(bindparam("now")))
_NEXT_RETRY = select(func.min(Dispatch.next_attempt_at)).where(Dispatch.state == DispatchState.queued,
                                                               Dispatch.next_attempt_at > bindparam("now"))
_NEXT_LEASE_END = select(func.min(Dispatch.claimed_until)).where(Dispatch.state == DispatchState.sending,
                                                                 Dispatch.claimed_until > bindparam("now"))


def _oldest_due_per_backend(
    session: Session, now: dt.datetime, exclude_backends: Collection[str], limit: int,
) -> dict[str, int]:
    """{backend: its oldest due row} for up to ``limit`` backends with a due row and no call in flight.

    Index lookups per backend, never a walk over the queue, so a claim costs the same however many
    rows wait behind the first of each lane (bench/dispatch_drain.py): the backends with queued rows
    come from a loose scan of ``ix_dispatches_state_backend`` (one seek per backend, a recursive CTE),
    each one's oldest due row from the same index in id order; rows whose lease ran out are few
    (at most one per backend in flight) and are read on their own.
    """
    at = {"now": now}
    found: dict[str, int] = {}
    for backend, dispatch_id in session.execute(_OLDEST_DUE_PER_LANE, at):
        if dispatch_id is not None:
            found[backend] = dispatch_id
    for dispatch_id, backend in session.execute(_LEASE_ENDED_ROWS, at):
        found[backend] = min(found.get(backend, dispatch_id), dispatch_id)
    skipped = set(exclude_backends) | set(session.scalars(_IN_FLIGHT_BACKENDS, at))
    candidates = sorted((i, b) for b, i in found.items() if b not in skipped)[:limit]
    return {backend: dispatch_id for dispatch_id, backend in candidates}


def _lock_backends(session: Session, chosen_ids: dict[str, int], now: dt.datetime) -> dict[str, int]:
    """PostgreSQL: keep the backends whose advisory lock this transaction got, each with its oldest due
    row as seen now (READ COMMITTED: a new statement sees every claim committed before the lock)."""
    locked: dict[str, int] = {}
    for backend in chosen_ids:
        got = session.scalar(select(func.pg_try_advisory_xact_lock(_BACKEND_LOCK_SPACE, func.hashtext(backend))))
        if not got:
            continue
        if session.scalar(select(Dispatch.id).where(*_in_flight(now), Dispatch.backend == backend).limit(1)) is not None:
            continue
        firsts = [session.scalar(select(Dispatch.id).where(Dispatch.backend == backend, *due)
                                 .order_by(Dispatch.id).limit(1).with_for_update())
                  for due in (_queued_due(now), _lease_ended(now))]
        oldest = min((f for f in firsts if f is not None), default=None)
        if oldest is not None:
            locked[backend] = oldest
    return locked


def finish(
    session: Session, dispatch_id: int, claimer: str, *, now: dt.datetime, state: str, attempted: bool,
    last_error: str | None = None, last_status: int | None = None, next_attempt_at: dt.datetime | None = None,
) -> bool:
    """Record an outcome if ``claimer`` still holds the row; False when the claim was lost."""
    values: dict[str, Any] = {
        "state": state, "updated_at": now, "last_error": last_error, "last_status": last_status,
        "claimed_by": claimer if state == DispatchState.sent else None, "claimed_until": None,
    }
    if attempted:
        values["attempts"] = Dispatch.attempts + 1
    if state == DispatchState.sent:
        values["sent_at"] = now
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    result = session.execute(
        update(Dispatch)
        .where(Dispatch.id == dispatch_id, Dispatch.claimed_by == claimer, Dispatch.state == DispatchState.sending)
        .values(**values)
    )
    return result.rowcount == 1


def depth(session: Session) -> dict[str, int]:
    counts = dict.fromkeys(DispatchState.ALL, 0)
    for state, count in session.execute(select(Dispatch.state, func.count()).group_by(Dispatch.state)):
        counts[state] = count
    return counts


def next_due_at(session: Session, now: dt.datetime) -> dt.datetime | None:
    """When the next row comes due by itself: a retry's time or a lease's end still ahead of ``now``.

    Rows already due are left out: if one was not claimed, its backend is busy or its credential rests,
    and what ends that (a finished send, the rest's end) is waited for on its own."""
    queued = session.scalar(_NEXT_RETRY, {"now": now})
    leased = session.scalar(_NEXT_LEASE_END, {"now": now})
    candidates = [t for t in (queued, leased) if t is not None]
    return min(candidates) if candidates else None


def list_views(session: Session, delivery_id: str | None = None) -> list[DispatchView]:
    query = select(Dispatch).order_by(Dispatch.id)
    if delivery_id is not None:
        query = query.where(Dispatch.delivery_id == delivery_id)
    return [
        DispatchView(**{f.name: getattr(row, f.name) for f in dataclasses.fields(DispatchView)})
        for row in session.scalars(query)
    ]
