"""Runs: one row per (delivery, backend, downstream run id, attempt), the record callbacks update.

Written by the dispatcher (``record_sent``, in the transaction that marks a dispatch sent: a dispatch
that starts a run gets its ``dispatched`` row; a ``pull_request.closed`` dispatch cancels that PR's open
runs of the backend), by callbacks (``bind`` then a state change decided by :mod:`relay.store.run_states`;
``supersede`` when a newer run of a PR starts) and by the sweeper (time-outs). Read by reporting, re-runs, the
level review and the dashboard. The downstream run id and attempt are unknown until the first
callback: the ``dispatched`` row has them NULL and the first callback binds them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, UniqueConstraint, and_, select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from conformance.provenance import describe as describe_provenance
from relay.store.run_states import (
    FINAL_STATES, RunState, TransitionRefused, check_transition, execution_seconds, queue_seconds,
)
from relay.store import quarantine
from relay.store.base import Base
from relay.store.deliveries import Delivery
from relay.store.dispatches import Dispatch

__all__ = ["RUN_ROWS", "TIME_OUTS", "RunRow", "RunView", "starts_a_run"]

# Quarantine worker names of the passes below.
RUN_ROWS = "run_rows"  # the run a sent dispatch starts (or the runs its close cancels)
TIME_OUTS = "time_outs"

_ID = BigInteger().with_variant(Integer, "sqlite")
_OPEN = (RunState.dispatched.value, RunState.in_progress.value)
_FINAL = tuple(s.value for s in FINAL_STATES)
# pull_request actions whose dispatch starts a downstream run (closed cancels; unlabeled starts nothing).
_RUN_ACTIONS = frozenset({"opened", "reopened", "synchronize", "labeled", "rerun"})


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("dispatch_id", "run_id", "run_attempt", name="uq_runs_dispatch_run_attempt"),
        Index("ix_runs_backend_dispatched", "backend", "dispatched_at"),
        Index("ix_runs_pr", "upstream_repository", "pr_number"),
        Index("ix_runs_state", "state"),
        Index("ix_runs_head_sha", "head_sha"),
        Index("ix_runs_updated_at", "updated_at"),
        # Newest runs first (the overview) and a window of them (the level review).
        Index("ix_runs_dispatched_at", "dispatched_at", "id"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    dispatch_id: Mapped[int] = mapped_column(_ID, ForeignKey("dispatches.id"))
    delivery_id: Mapped[str] = mapped_column(String(100))
    backend: Mapped[str] = mapped_column(String(100))
    upstream_repository: Mapped[str] = mapped_column(String(200))
    event: Mapped[str] = mapped_column(String(100))
    pr_number: Mapped[int | None] = mapped_column(Integer)
    title: Mapped[str | None] = mapped_column(Text)
    head_sha: Mapped[str] = mapped_column(String(64))
    head_ref: Mapped[str | None] = mapped_column(String(255))
    run_id: Mapped[int | None] = mapped_column(BigInteger)
    run_attempt: Mapped[int | None] = mapped_column(Integer)
    run_url: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    conclusion: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    dispatched_at: Mapped[dt.datetime] = mapped_column(DateTime)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    torch_version: Mapped[str | None] = mapped_column(String(100))
    # The report's torch.git_version and conformance.provenance's verdict against head_sha (NULL: no report).
    torch_git_version: Mapped[str | None] = mapped_column(String(64))
    provenance: Mapped[str | None] = mapped_column(String(16))
    # The result batch holding the run's test results (0: none, or written in its final transition).
    results_batch: Mapped[int] = mapped_column(_ID, default=0, server_default="0")


@dataclasses.dataclass(frozen=True)
class RunView:
    id: int
    dispatch_id: int
    delivery_id: str
    backend: str
    upstream_repository: str
    event: str
    pr_number: int | None
    title: str | None
    head_sha: str
    head_ref: str | None
    run_id: int | None
    run_attempt: int | None
    run_url: str | None
    state: str
    conclusion: str | None
    reason: str | None
    dispatched_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    summary: dict[str, Any] | None
    torch_version: str | None
    torch_git_version: str | None = None
    provenance: str | None = None  # matched | mismatched | unknown (conformance.provenance); None without a report

    @property
    def provenance_problem(self) -> str | None:
        """The sentence saying this run tested another torch than the dispatched commit, else None."""
        return describe_provenance(self.provenance, self.torch_git_version, self.head_sha)

    @property
    def queue_seconds(self) -> float | None:
        return queue_seconds(self.dispatched_at, self.started_at)

    @property
    def execution_seconds(self) -> float | None:
        return execution_seconds(self.started_at, self.finished_at)

    @property
    def outcome(self) -> str:
        """One word for colour and counts: the conclusion when finished, else the state."""
        if self.state == RunState.completed.value:
            return self.conclusion or "completed"
        return self.state

    def describe(self) -> str:
        run = f"run {self.run_id} attempt {self.run_attempt}" if self.run_id is not None else f"dispatch {self.dispatch_id}"
        return f"{self.backend} {run} (delivery {self.delivery_id})"


def view(row: RunRow) -> RunView:
    return RunView(**{f.name: getattr(row, f.name) for f in dataclasses.fields(RunView)})


def starts_a_run(client_payload: dict[str, Any]) -> bool:
    event = client_payload.get("event")
    return event == "push" or (event == "pull_request" and client_payload.get("action") in _RUN_ACTIONS)


def _new_row(dispatch: Dispatch, title: str | None, dispatched_at: dt.datetime, now: dt.datetime) -> RunRow:
    payload = dispatch.client_payload or {}
    pr = payload.get("pull_request") or {}
    head = payload.get("head") or {}
    return RunRow(
        dispatch_id=dispatch.id, delivery_id=dispatch.delivery_id, backend=dispatch.backend,
        upstream_repository=str(payload.get("repository") or ""), event=dispatch.event_type,
        pr_number=pr.get("number") if isinstance(pr.get("number"), int) else None, title=title,
        head_sha=str(head.get("sha") or ""), head_ref=head.get("ref"), state=RunState.dispatched.value,
        dispatched_at=dispatched_at, updated_at=now,
    )


def _title(session: Session, delivery_id: str) -> str | None:
    """The PR title from the summary intake stored for the delivery, if it has one."""
    summary = session.scalar(select(Delivery.summary).where(Delivery.delivery_id == delivery_id))
    title = summary.get("title") if isinstance(summary, dict) else None
    return title[:500] if isinstance(title, str) else None


def record_sent(session: Session, dispatch: Dispatch, now: dt.datetime) -> list[int]:
    """The run rows a dispatch marked sent creates or cancels: a run-starting dispatch gets its
    ``dispatched`` row, unless its run called back first and has one; a ``pull_request.closed`` one cancels
    the backend's open runs of that PR that were dispatched before it. Returns the ids of the runs written."""
    payload = dispatch.client_payload or {}
    sent_at = dispatch.sent_at or now
    if starts_a_run(payload):
        # The downstream run may call back before its dispatch is marked sent (GitHub answered, the run
        # started and its callback took the dispatch's lock first): ``bind`` has made the run's row then.
        if session.scalar(select(RunRow.id).where(RunRow.dispatch_id == dispatch.id).limit(1)) is not None:
            return []
        row = _new_row(dispatch, _title(session, dispatch.delivery_id), sent_at, now)
        session.add(row)
        session.flush()
        return [row.id]
    if payload.get("event") == "pull_request" and payload.get("action") == "closed":
        number = (payload.get("pull_request") or {}).get("number")
        open_runs = session.scalars(
            select(RunRow).where(
                RunRow.backend == dispatch.backend, RunRow.pr_number == number,
                RunRow.upstream_repository == payload.get("repository"), RunRow.state.in_(_OPEN),
                RunRow.dispatched_at <= sent_at,
            ).with_for_update()
        ).all()
        for run in open_runs:
            run.state, run.reason, run.finished_at, run.updated_at = (
                RunState.cancelled.value, "pull_request_closed", now, now,
            )
        return [run.id for run in open_runs]
    return []


def bind(session: Session, dispatch: Dispatch, run_id: int, run_attempt: int, now: dt.datetime,
         max_attempts: int = 10) -> RunRow:
    """The row of (dispatch, run id, attempt): the matching row, else the dispatch's unbound
    ``dispatched`` row, else a new row (a later attempt). The caller holds the dispatch's lock.

    A dispatch's nonce binds the one downstream run that first called back with it: another run id
    raises ``TransitionRefused("nonce_bound_to_other_run")``, and an attempt of the bound run that is not
    later than every known attempt raises ``TransitionRefused("attempt_not_later")``. Attempts are
    consecutive (a new one is the next after the latest known: ``attempt_not_consecutive``) and at most
    ``max_attempts`` per dispatch (``RELAY_CALLBACK_MAX_ATTEMPTS``: ``too_many_attempts``), so one dispatch
    can never count as many runs.
    """
    rows = session.scalars(select(RunRow).where(RunRow.dispatch_id == dispatch.id).order_by(RunRow.id)).all()
    for row in rows:
        if row.run_id == run_id and row.run_attempt == run_attempt:
            return row
    bound = [row for row in rows if row.run_id is not None]
    if bound and bound[0].run_id != run_id:
        raise TransitionRefused(
            "nonce_bound_to_other_run",
            f"the nonce of dispatch {dispatch.id} (delivery {dispatch.delivery_id}) is bound to downstream run "
            f"{bound[0].run_id}; run {run_id} cannot report with it (each dispatch starts one run)",
        )
    if bound and run_attempt <= max(row.run_attempt or 0 for row in bound):
        raise TransitionRefused(
            "attempt_not_later",
            f"run {run_id} attempt {run_attempt} is not later than attempt "
            f"{max(row.run_attempt or 0 for row in bound)} already reported for dispatch {dispatch.id}",
        )
    if run_attempt > max_attempts:
        raise TransitionRefused(
            "too_many_attempts",
            f"run {run_id} attempt {run_attempt} of dispatch {dispatch.id}: at most {max_attempts} attempts are "
            "accepted per dispatch (RELAY_CALLBACK_MAX_ATTEMPTS)",
        )
    latest = max((row.run_attempt or 0 for row in bound), default=0)
    if bound and run_attempt != latest + 1:
        raise TransitionRefused(
            "attempt_not_consecutive",
            f"run {run_id} attempt {run_attempt} does not follow attempt {latest}, the latest reported for "
            f"dispatch {dispatch.id}; attempts are consecutive",
        )
    for row in rows:
        if row.run_id is None:
            if row.state not in _FINAL:
                row.run_id, row.run_attempt, row.updated_at = run_id, run_attempt, now
            return row
    # A new attempt of a run the relay already knows (a re-run downstream): it was requested now.
    dispatched_at = (dispatch.sent_at or now) if not rows else now
    row = _new_row(dispatch, _title(session, dispatch.delivery_id), dispatched_at, now)
    row.run_id, row.run_attempt = run_id, run_attempt
    session.add(row)
    session.flush()
    return row


def supersede(session: Session, started: RunRow, now: dt.datetime) -> list[RunRow]:
    """Cancel (reason ``superseded``) the older runs of ``started``'s PR and backend that never started."""
    if started.pr_number is None:
        return []
    older = session.scalars(
        select(RunRow).where(
            RunRow.backend == started.backend, RunRow.upstream_repository == started.upstream_repository,
            RunRow.pr_number == started.pr_number, RunRow.state == RunState.dispatched.value,
            RunRow.dispatched_at <= started.dispatched_at, RunRow.id != started.id,
            RunRow.dispatch_id != started.dispatch_id,
        ).order_by(RunRow.id).with_for_update()
    ).all()
    for run in older:
        check_transition(RunState.dispatched, RunState.cancelled, run=view(run).describe())
        run.state, run.reason, run.finished_at, run.updated_at = RunState.cancelled.value, "superseded", now, now
    return list(older)


def timed_out_candidates(
    session: Session, *, unstarted_before: dt.datetime, running_before: dt.datetime,
) -> list[tuple[RunRow, str]]:
    """Open runs past their limits, locked, each with its reason name.

    Locked ``FOR NO KEY UPDATE SKIP LOCKED`` on PostgreSQL: a run another pass is changing is skipped, but
    not one whose key is merely referenced by a row being written (reporting's first reported state, a
    report's test results take ``FOR KEY SHARE`` on it), which a plain ``FOR UPDATE`` would skip until the
    next sweep. The time-out changes no key."""
    rows = session.scalars(
        select(RunRow).where(
            (and_(RunRow.state == RunState.dispatched.value, RunRow.dispatched_at < unstarted_before))
            | (and_(RunRow.state == RunState.in_progress.value, RunRow.started_at < running_before))
        ).order_by(RunRow.id).with_for_update(skip_locked=True, key_share=True)
    ).all()
    return [(row, "never_started" if row.state == RunState.dispatched.value else "ran_too_long") for row in rows]


def get(session: Session, run_pk: int) -> RunView | None:
    row = session.get(RunRow, run_pk)
    return None if row is None else view(row)


def query(
    session: Session, *, backend: str | None = None, pr_number: int | None = None,
    upstream_repository: str | None = None, head_sha: str | None = None, since: dt.datetime | None = None,
    until: dt.datetime | None = None, states: tuple[str, ...] | None = None, limit: int | None = None,
    newest_first: bool = True,
) -> list[RunView]:
    stmt = select(RunRow)
    if backend is not None:
        stmt = stmt.where(RunRow.backend == backend)
    if pr_number is not None:
        stmt = stmt.where(RunRow.pr_number == pr_number)
    if upstream_repository is not None:
        stmt = stmt.where(RunRow.upstream_repository == upstream_repository)
    if head_sha is not None:
        stmt = stmt.where(RunRow.head_sha == head_sha)
    if since is not None:
        stmt = stmt.where(RunRow.dispatched_at >= since)
    if until is not None:
        stmt = stmt.where(RunRow.dispatched_at < until)
    if states is not None:
        stmt = stmt.where(RunRow.state.in_(states))
    order = (RunRow.dispatched_at.desc(), RunRow.id.desc()) if newest_first else (RunRow.dispatched_at, RunRow.id)
    stmt = stmt.order_by(*order)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [view(row) for row in session.scalars(stmt)]
