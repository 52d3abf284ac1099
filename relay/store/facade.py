"""The store's operations, one transaction each: the only way the rest of the relay reaches SQL.

Triggered by intake (``submit_delivery``: group commit, see ``group_commit``), the dispatcher (``claim_dispatches``, ``finish_dispatch``),
start-up (``migrate``, ``sync_backends``) and observability (``probe``, ``outbox_depth``). Database
errors surface as :class:`StoreUnavailable`, so callers can answer 503 without knowing SQLAlchemy.

Every wait is bounded by ``deadline_seconds``: the engine's timeouts (see ``database``), this process's
SQLite write lock, and the wait of intake and ``/readyz`` on their writes, which holds even when the
database itself is frozen and no timeout of its own fires.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session, sessionmaker

from relay.store import (
    backends, credential_gates, deliveries, dispatches, level_holds, probes, pull_requests, quarantine, runs,
    worker_leases,
)
from relay.store.base import utcnow
from relay.store.database import READ_ONLY, create_store_engine, normalise_url, run_migrations
from relay.store.errors import StoreRefused, StoreUnavailable, describe, guarded, is_outage, refusal
from relay.store.group_commit import GroupCommitter, WriterClosed
from relay.store.write_lock import WriteLock
from relay.store.results_operations import ResultsOperations

if TYPE_CHECKING:
    from relay.trust import BackendTarget

__all__ = ["Store", "StoreRefused", "StoreUnavailable"]


@dataclasses.dataclass(frozen=True)
class _IntakeWrite:
    delivery: deliveries.NewDelivery
    dispatches: Sequence[dispatches.NewDispatch]
    pull_request: pull_requests.PullRequestSnapshot | None
    received_at: dt.datetime


_DELIVERY_FIELDS = tuple(f.name for f in dataclasses.fields(deliveries.NewDelivery))


class Store(ResultsOperations):
    """Store(url, deadline_seconds=5, replay_window_seconds=None): a database (SQLite file or PostgreSQL)
    holding deliveries, the outbox, PRs, backends; no wait on it lasts past ``deadline_seconds``; a
    signed body stored again under a fresh delivery id within ``replay_window_seconds`` (None: ever)
    is a duplicate."""

    def __init__(self, url: str, *, deadline_seconds: float = 5.0, replay_window_seconds: float | None = None):
        self.deadline_seconds = deadline_seconds
        self.replay_window = None if replay_window_seconds is None else dt.timedelta(seconds=replay_window_seconds)
        self.engine = create_store_engine(url, deadline_seconds)
        self.safe_url = normalise_url(url).render_as_string(hide_password=True)
        self.dialect = self.engine.dialect.name
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)
        # SQLite has one writer at a time and every transaction here takes the write lock (BEGIN
        # IMMEDIATE); queueing the threads of this process on a lock is fair and prompt, where SQLite's
        # busy handler sleeps and retries (tens of ms per wait under load). Bulk writes go last (write_lock).
        self._writer = WriteLock(yield_seconds=deadline_seconds / 2) if self.dialect == "sqlite" else None
        self._intake = GroupCommitter(self._write_deliveries)
        # Health checks run here, one at a time: a check stuck on a frozen database is waited for
        # (up to the deadline) by later checks instead of each stranding a thread of its own.
        self._probe_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relay-store-probe")
        self._probe_lock = threading.Lock()
        self._probe_pending: concurrent.futures.Future | None = None
        self._probe_started = 0.0

    @contextmanager
    def _write_lock(self, *, bulk: bool = False) -> Iterator[None]:
        """This process's SQLite write lock, waited for no longer than the deadline (no-op on PostgreSQL);
        ``bulk``: a big report's chunk, which lets every other waiting write go first."""
        if self._writer is None:
            yield
            return
        if not self._writer.acquire(self.deadline_seconds, bulk=bulk):
            raise StoreUnavailable(
                f"store {self.safe_url} unavailable: its write lock was busy for {self.deadline_seconds:g}s "
                "(RELAY_STORE_DEADLINE_SECONDS)"
            )
        try:
            yield
        finally:
            self._writer.release()

    @contextmanager
    def _transaction(self, *, bulk: bool = False) -> Iterator[Session]:
        with self._write_lock(bulk=bulk), self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        """A read-only transaction: without this process's write lock and, on SQLite, begun deferred
        (see ``database``), so reads (the dashboard, /metrics) never hold up a write; bounded in time by
        the engine's timeouts like every statement."""
        with self._read_sessions() as session, session.begin():
            yield session

    # --- lifecycle ------------------------------------------------------------------------------
    @guarded
    def migrate(self) -> None:
        run_migrations(self.engine)

    @guarded
    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def probe(self) -> None:
        """Write the probe row within the deadline, or raise :class:`StoreUnavailable` saying why."""
        asked_at = time.monotonic()
        deadline = asked_at + self.deadline_seconds
        while True:
            with self._probe_lock:
                if self._probe_pending is None or self._probe_pending.done():
                    self._probe_pending = self._probe_pool.submit(self._write_probe)
                    self._probe_started = time.monotonic()
                pending, started = self._probe_pending, self._probe_started
            try:
                pending.result(timeout=max(0.0, deadline - time.monotonic()))
                return
            except concurrent.futures.TimeoutError:
                raise StoreUnavailable(
                    f"store {self.safe_url} cannot be written: a write has not finished within "
                    f"{self.deadline_seconds:g}s (RELAY_STORE_DEADLINE_SECONDS)"
                ) from None
            except StoreUnavailable as exc:
                # A probe begun before this call may have failed on a lock or outage gone since: the
                # answer must describe the store as it is now, so a fresh probe gets what is left of the deadline.
                if started < asked_at and time.monotonic() < deadline:
                    continue
                raise StoreUnavailable(f"store {self.safe_url} cannot be written: {exc}") from exc

    @guarded
    def _write_probe(self) -> None:
        with self._transaction() as session:
            probes.write(session, utcnow())

    def close(self) -> None:
        self._intake.close()  # pending webhooks are committed (and answered) first
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
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
        :class:`StoreUnavailable` (nothing written) or :class:`StoreRefused` (the database refused this
        webhook's rows; the other webhooks of the batch are committed without it). The caller bounds its
        wait (``deadline_seconds``) and cancels the future when it gives up: a write not yet started is
        then dropped.
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
        """One transaction for the batch. If the database cannot answer, every webhook hears
        :class:`StoreUnavailable`; if it refuses anything else (a constraint, a value out of range, an
        error of our own), each webhook is written alone, so only the culprit fails."""
        try:
            with self._write_lock(), self.engine.begin() as connection:
                if self.replay_window is not None:
                    deliveries.forget_old_digests(
                        connection, sorted({w.delivery.body_sha256 for w in writes if w.delivery.body_sha256}),
                        received_before=utcnow() - self.replay_window)
                return self._insert_deliveries(connection, writes)
        except StoreUnavailable as exc:
            return [exc for _ in writes]
        except Exception as exc:  # noqa: BLE001 - whatever refused the batch, the neighbours must not pay
            if is_outage(exc):
                message = f"store {self.safe_url} unavailable: {describe(exc)}"
                return [StoreUnavailable(message) for _ in writes]
            if len(writes) > 1:
                return [outcome for write in writes for outcome in self._write_deliveries([write])]
            return [refusal(exc, "its rows", prefix=f"delivery {writes[0].delivery.delivery_id}: ")]

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
        with self._reading() as session:
            return deliveries.get(session, delivery_id)

    @guarded
    def pull_request_labels(self, repository: str, number: int) -> tuple[str, ...] | None:
        with self._reading() as session:
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
    def live_claimers(self) -> list[str]:
        """Who holds the live claims (``sending`` rows whose lease has not ended)."""
        with self._reading() as session:
            return dispatches.live_claimers(session, utcnow())

    @guarded
    def end_claims(self, claimer: str) -> int:
        """End ``claimer``'s live claims now (its process is known dead); how many rows are due again."""
        with self._transaction() as session:
            return dispatches.end_claims(session, claimer, utcnow())

    @guarded
    def finish_dispatch(
        self, dispatch_id: int, claimer: str, *, state: str, attempted: bool, last_error: str | None = None,
        last_status: int | None = None, retry_in_seconds: float | None = None,
    ) -> bool:
        """Record a send's outcome if ``claimer`` still holds the row (False: the claim was lost, nothing
        written). Marking it sent creates, in the same transaction, the run it starts (or cancels the
        runs a ``closed`` event ends), so no sent dispatch is ever without its run."""
        now = utcnow()
        next_at = None if retry_in_seconds is None else now + dt.timedelta(seconds=retry_in_seconds)
        with self._transaction() as session:
            kept = dispatches.finish(
                session, dispatch_id, claimer, now=now, state=state, attempted=attempted,
                last_error=last_error, last_status=last_status, next_attempt_at=next_at,
            )
            if kept and state == dispatches.DispatchState.sent:
                # In a savepoint of its own: a run that cannot be written (bad data in the delivery) is
                # quarantined, and the dispatch is still recorded sent (never sent again for it).
                dispatch = session.get(dispatches.Dispatch, dispatch_id)
                quarantine.each_row(session, runs.RUN_ROWS, [(f"dispatch {dispatch_id}", dispatch)],
                                    lambda row: runs.record_sent(session, row, now), now)
            return kept

    # --- credential gates (shared by every process on this database) ------------------------------
    @staticmethod
    def _bucket(per_minute: float) -> tuple[float, float]:
        return per_minute / 60.0, max(per_minute, 1.0)  # rate per second, capacity: a minute's worth

    @guarded
    def credential_allowances(self, credentials: Collection[str], *, per_minute: float) -> dict[str, int]:
        """Calls each credential may make now (0 while it rests or is paused)."""
        with self._reading() as session:
            return credential_gates.allowances(session, sorted(credentials), utcnow(), *self._bucket(per_minute))

    @guarded
    def take_credential(self, credential: str, *, per_minute: float) -> tuple[float, bool]:
        """Reserve one call of ``credential``: (0, paused) if reserved, else (seconds to wait, paused)."""
        with self._transaction() as session:
            return credential_gates.take(session, credential, utcnow(), *self._bucket(per_minute))

    @guarded
    def rest_credential(self, credential: str, seconds: float, *, per_minute: float, paused: bool = False,
                        reason: str | None = None) -> None:
        """No process calls with ``credential`` for ``seconds``; ``paused``: GitHub refused it (``reason``)."""
        now = utcnow()
        with self._transaction() as session:
            credential_gates.rest(session, credential, now + dt.timedelta(seconds=seconds), now,
                                  self._bucket(per_minute)[1], paused=paused, reason=reason)

    @guarded
    def resume_credential(self, credential: str) -> None:
        with self._transaction() as session:
            credential_gates.resume(session, credential)

    @guarded
    def credential_gates(self) -> list[credential_gates.GateView]:
        with self._reading() as session:
            return credential_gates.views(session)

    @guarded
    def seconds_until_next_due(self) -> float | None:
        """Seconds until a row comes due by itself or a credential's rest ends (None: nothing will)."""
        now = utcnow()
        with self._reading() as session:
            times = [t for t in (dispatches.next_due_at(session, now), credential_gates.next_rest_end(session, now)) if t]
        return None if not times else max(0.0, (min(times) - now).total_seconds())

    @guarded
    def outbox_depth(self) -> dict[str, int]:
        with self._reading() as session:
            return dispatches.depth(session)

    @guarded
    def dispatches(self, delivery_id: str | None = None) -> list[dispatches.DispatchView]:
        with self._reading() as session:
            return dispatches.list_views(session, delivery_id)

    # --- backends -------------------------------------------------------------------------------
    @guarded
    def sync_backends(self, targets: Sequence[BackendTarget]) -> dict[str, tuple[str, str]]:
        """Record the allowlist as loaded; backends no longer in it are kept, inactive. Returns
        {backend: (old level, new level)} for each level it changed (the level's version moves on)."""
        with self._transaction() as session:
            return backends.sync(session, list(targets), utcnow())

    @guarded
    def backends(self) -> list[backends.BackendRecord]:
        with self._reading() as session:
            return backends.all_records(session)

    # --- level holds (a backend below its level's hold bar; see ``level_holds``; ``now``: the caller's clock)
    @guarded
    def current_level_hold(self, backend: str) -> level_holds.LevelHold | None:
        """The backend's active hold (below its bar since ``started_at``), or None."""
        with self._reading() as session:
            return level_holds.current(session, backend)

    @guarded
    def level_holds(self, backend: str, *, limit: int = 20) -> list[level_holds.LevelHold]:
        """The backend's holds, newest first (the active one, if any, first)."""
        with self._reading() as session:
            return level_holds.history(session, backend, limit)

    @guarded
    def start_level_hold(self, backend: str, level: str, reason: str,
                         *, now: dt.datetime | None = None) -> level_holds.LevelHold:
        """Open a hold (or return the active one, noted below its bar again)."""
        with self._transaction() as session:
            return level_holds.start(session, backend, level, reason, now or utcnow())

    @guarded
    def mark_level_hold_above_bar(self, backend: str,
                                  *, now: dt.datetime | None = None) -> level_holds.LevelHold | None:
        """Note that the backend of the active hold meets its bar again (from now, unless already noted)."""
        with self._transaction() as session:
            return level_holds.mark_above(session, backend, now or utcnow())

    @guarded
    def end_level_hold(self, backend: str, ended_by: str,
                       *, now: dt.datetime | None = None) -> level_holds.LevelHold | None:
        """End the active hold, saying who or what ended it; None when there is none."""
        with self._transaction() as session:
            return level_holds.end(session, backend, ended_by, now or utcnow())

    @guarded
    def take_worker_lease(self, worker: str, holder: str, seconds: float, *, now: dt.datetime | None = None) -> bool:
        """Take or renew the lease on ``worker`` for ``holder`` (False: another process holds it)."""
        with self._transaction() as session:
            return worker_leases.take(session, worker, holder, now or utcnow(), seconds)

    @guarded
    def release_worker_lease(self, worker: str, holder: str) -> None:
        with self._transaction() as session:
            worker_leases.release(session, worker, holder)

    @guarded
    def worker_leases(self) -> list[worker_leases.LeaseView]:
        with self._reading() as session:
            return worker_leases.views(session)
