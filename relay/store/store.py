"""The store's operations, one transaction each: the only way the rest of the relay reaches SQL.

Triggered by intake (``submit_delivery``: group commit, see ``group_commit``), the dispatcher (``claim_dispatches``, ``finish_dispatch``),
start-up (``migrate``, ``sync_backends``) and observability (``ping``, ``outbox_depth``). Database
errors surface as :class:`StoreUnavailable`, so callers can answer 503 without knowing SQLAlchemy.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session, sessionmaker

from relay.store import backends, deliveries, dispatches, pull_requests
from relay.store.base import utcnow
from relay.store.database import create_store_engine, normalise_url, run_migrations
from relay.store.errors import StoreUnavailable, describe, guarded
from relay.store.group_commit import GroupCommitter, WriterClosed
from relay.store.results_operations import ResultsOperations

if TYPE_CHECKING:
    from relay.trust import BackendTarget

__all__ = ["Store", "StoreUnavailable"]


@dataclasses.dataclass(frozen=True)
class _IntakeWrite:
    delivery: deliveries.NewDelivery
    dispatches: Sequence[dispatches.NewDispatch]
    pull_request: pull_requests.PullRequestSnapshot | None
    received_at: dt.datetime


_DELIVERY_FIELDS = tuple(f.name for f in dataclasses.fields(deliveries.NewDelivery))


class Store(ResultsOperations):
    """Store(url): a database (SQLite file or PostgreSQL) holding deliveries, the outbox, PRs, backends."""

    def __init__(self, url: str):
        self.engine = create_store_engine(url)
        self.safe_url = normalise_url(url).render_as_string(hide_password=True)
        self.dialect = self.engine.dialect.name
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time and every transaction here takes the write lock (BEGIN
        # IMMEDIATE); queueing the threads of this process on a lock is fair and prompt, where SQLite's
        # busy handler sleeps and retries (tens of ms per wait under load).
        self._writer = threading.Lock() if self.dialect == "sqlite" else contextlib.nullcontext()
        self._intake = GroupCommitter(self._write_deliveries)

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self._writer, self._sessions() as session, session.begin():
            yield session

    # --- lifecycle ------------------------------------------------------------------------------
    @guarded
    def migrate(self) -> None:
        run_migrations(self.engine)

    @guarded
    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def close(self) -> None:
        self._intake.close()  # pending webhooks are committed (and answered) first
        self.engine.dispose()

    # --- intake ---------------------------------------------------------------------------------
    def submit_delivery(
        self,
        delivery: deliveries.NewDelivery,
        new_dispatches: Sequence[dispatches.NewDispatch] = (),
        pull_request: pull_requests.PullRequestSnapshot | None = None,
    ) -> concurrent.futures.Future:
        """Queue a delivery, its outbox rows and its PR snapshot for the next group commit.

        The future resolves once they are committed: True (stored), False (this delivery id was already
        stored, or an earlier copy is in the same batch: nothing of this copy is written), or it raises
        :class:`StoreUnavailable` (nothing written) or ``IntegrityError`` (another constraint refused
        this webhook's rows; the other webhooks of the batch are committed without it).
        """
        write = _IntakeWrite(delivery, tuple(new_dispatches), pull_request, utcnow())
        try:
            return self._intake.submit(write)
        except WriterClosed:
            raise StoreUnavailable(f"store {self.safe_url} is closed") from None

    def record_delivery(
        self,
        delivery: deliveries.NewDelivery,
        new_dispatches: Sequence[dispatches.NewDispatch] = (),
        pull_request: pull_requests.PullRequestSnapshot | None = None,
    ) -> bool:
        """Write a delivery, its outbox rows and its PR snapshot atomically; False if already seen."""
        return self.submit_delivery(delivery, new_dispatches, pull_request).result()

    def _write_deliveries(self, writes: Sequence[_IntakeWrite]) -> list[Any]:
        """One transaction for the batch; on a constraint failure, each webhook alone (to find the culprit)."""
        try:
            with self._writer, self.engine.begin() as connection:
                return self._insert_deliveries(connection, writes)
        except sa_exc.IntegrityError as exc:
            if len(writes) == 1:
                return [exc]
            return [outcome for write in writes for outcome in self._write_deliveries([write])]
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            message = f"store {self.safe_url} unavailable: {describe(exc)}"
            return [StoreUnavailable(message) for _ in writes]

    @staticmethod
    def _insert_deliveries(connection: Connection, writes: Sequence[_IntakeWrite]) -> list[bool]:
        first: dict[str, int] = {}
        for index, write in enumerate(writes):
            first.setdefault(write.delivery.delivery_id, index)
        # Sorted ids: concurrent batches (several processes on PostgreSQL) take the key locks in one order.
        fresh = deliveries.insert_new(connection, [
            {"received_at": writes[index].received_at,
             **{name: getattr(writes[index].delivery, name) for name in _DELIVERY_FIELDS}}
            for _, index in sorted(first.items())
        ])
        stored = [first[w.delivery.delivery_id] == index and w.delivery.delivery_id in fresh for index, w in enumerate(writes)]
        kept = [write for write, keep in zip(writes, stored) if keep]
        dispatches.insert_rows(connection, [
            dispatches.queued_row(write.delivery.delivery_id, item, write.received_at)
            for write in kept for item in write.dispatches
        ])
        pull_requests.upsert_many(
            connection, [(write.pull_request, write.received_at) for write in kept if write.pull_request is not None]
        )
        return stored

    @guarded
    def delivery(self, delivery_id: str) -> deliveries.DeliveryView | None:
        with self._transaction() as session:
            return deliveries.get(session, delivery_id)

    @guarded
    def pull_request_labels(self, repository: str, number: int) -> tuple[str, ...] | None:
        with self._transaction() as session:
            return pull_requests.labels(session, repository, number)

    # --- dispatch -------------------------------------------------------------------------------
    @guarded
    def claim_dispatches(
        self, claimer: str, *, limit: int, lease_seconds: float, exclude_backends: Collection[str] = (),
        max_claims: int | None = None,
    ) -> list[dispatches.ClaimedDispatch]:
        """Claim up to ``max_claims`` due rows, the oldest of each backend not excluded."""
        now = utcnow()
        with self._transaction() as session:
            return dispatches.claim(
                session, now=now, claimer=claimer, lease_until=now + dt.timedelta(seconds=lease_seconds),
                limit=limit, exclude_backends=exclude_backends, max_claims=max_claims,
            )

    @guarded
    def finish_dispatch(
        self, dispatch_id: int, claimer: str, *, state: str, attempted: bool, last_error: str | None = None,
        last_status: int | None = None, retry_in_seconds: float | None = None,
    ) -> bool:
        now = utcnow()
        next_at = None if retry_in_seconds is None else now + dt.timedelta(seconds=retry_in_seconds)
        with self._transaction() as session:
            return dispatches.finish(
                session, dispatch_id, claimer, now=now, state=state, attempted=attempted,
                last_error=last_error, last_status=last_status, next_attempt_at=next_at,
            )

    @guarded
    def seconds_until_next_due(self) -> float | None:
        with self._transaction() as session:
            due = dispatches.next_due_at(session)
        return None if due is None else max(0.0, (due - utcnow()).total_seconds())

    @guarded
    def outbox_depth(self) -> dict[str, int]:
        with self._transaction() as session:
            return dispatches.depth(session)

    @guarded
    def dispatches(self, delivery_id: str | None = None) -> list[dispatches.DispatchView]:
        with self._transaction() as session:
            return dispatches.list_views(session, delivery_id)

    # --- backends -------------------------------------------------------------------------------
    @guarded
    def sync_backends(self, targets: Sequence[BackendTarget]) -> None:
        """Record the allowlist as loaded; backends no longer in it are kept, inactive."""
        with self._transaction() as session:
            backends.sync(session, list(targets), utcnow())

    @guarded
    def backends(self) -> list[backends.BackendRecord]:
        with self._transaction() as session:
            return backends.all_records(session)
