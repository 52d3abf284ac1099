"""Reported states: what reporting last decided per (run, target), and from which versions of the run
and of its PR's labels, so reporting finds its work by query and skips repeats.

Written by reporting after each decision (a GitHub write, a permanent GitHub error, a state already
shown, or nothing to show); read by reporting (``pending``: the runs whose ``updated_at`` or whose PR's
label ``recorded_at`` differ from the versions last decided from, and the runs at an open PR's head
whose backend's level changed, ``backends.level_changed_at``, after they were decided) and by re-runs (which runs have a
check run). ``target`` names where the state goes (``check_run`` or ``status``); ``external_id`` keeps
the check run's id so later states update the same check run. Because the work list is these rows, a
restart, a crash or a second relay process never leaves a state unreported.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import (
    BigInteger, DateTime, ForeignKey, Integer, PrimaryKeyConstraint, String, Text, and_, bindparam, or_, select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.backends import BackendRow
from relay.store.base import Base
from relay.store.pull_requests import PullRequest
from relay.store.runs import RunRow, RunView, view

__all__ = ["NOT_SHOWN", "PendingReport", "ReportedState", "ReportedStateRow"]

_ID = BigInteger().with_variant(Integer, "sqlite")
NOT_SHOWN = "not_shown"  # the state of a run whose level shows nothing upstream (yet)


class ReportedStateRow(Base):
    __tablename__ = "reported_states"
    __table_args__ = (PrimaryKeyConstraint("run_pk", "target", name="pk_reported_states"),)

    run_pk: Mapped[int] = mapped_column(_ID, ForeignKey("runs.id"))
    target: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(200))
    external_id: Mapped[int | None] = mapped_column(BigInteger)
    last_error: Mapped[str | None] = mapped_column(Text)
    reported_at: Mapped[dt.datetime] = mapped_column(DateTime)
    run_updated_at: Mapped[dt.datetime | None] = mapped_column(DateTime)  # the run version decided from
    labels_recorded_at: Mapped[dt.datetime | None] = mapped_column(DateTime)  # the PR label version
    level_changed_at: Mapped[dt.datetime | None] = mapped_column(DateTime)  # the backend level version


@dataclasses.dataclass(frozen=True)
class ReportedState:
    run_pk: int
    target: str
    state: str
    external_id: int | None
    last_error: str | None
    reported_at: dt.datetime
    run_updated_at: dt.datetime | None = None
    labels_recorded_at: dt.datetime | None = None
    level_changed_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class PendingReport:
    """A run to decide again: its current row, its PR's labels (None for a push; empty when the PR is
    unknown) and their version, what was decided last (None: never), and the level the store holds for
    its backend with that level's version (None: unknown backend, or never changed)."""

    run: RunView
    labels: tuple[str, ...] | None
    labels_recorded_at: dt.datetime | None
    previous: ReportedState | None
    backend_level: str | None = None
    level_changed_at: dt.datetime | None = None


def _view(row: ReportedStateRow) -> ReportedState:
    return ReportedState(row.run_pk, row.target, row.state, row.external_id, row.last_error, row.reported_at,
                         row.run_updated_at, row.labels_recorded_at, row.level_changed_at)


def get(session: Session, run_pk: int, target: str) -> ReportedState | None:
    row = session.get(ReportedStateRow, (run_pk, target))
    return None if row is None else _view(row)


def put(
    session: Session, run_pk: int, target: str, state: str, *, external_id: int | None, last_error: str | None,
    now: dt.datetime, run_updated_at: dt.datetime | None = None, labels_recorded_at: dt.datetime | None = None,
    level_changed_at: dt.datetime | None = None,
) -> None:
    row = session.get(ReportedStateRow, (run_pk, target), with_for_update=True)
    if row is None:
        session.add(ReportedStateRow(
            run_pk=run_pk, target=target, state=state, external_id=external_id, last_error=last_error, reported_at=now,
            run_updated_at=run_updated_at, labels_recorded_at=labels_recorded_at, level_changed_at=level_changed_at,
        ))
        return
    row.state, row.last_error, row.reported_at = state, last_error, now
    row.run_updated_at, row.labels_recorded_at = run_updated_at, labels_recorded_at
    row.level_changed_at = level_changed_at
    if external_id is not None:
        row.external_id = external_id


def for_runs(session: Session, run_pks: list[int]) -> list[ReportedState]:
    if not run_pks:
        return []
    return [_view(row) for row in session.scalars(select(ReportedStateRow).where(ReportedStateRow.run_pk.in_(run_pks)))]


def _pending_statement(*, skipping: bool):
    """The reporter's query of every pass (``pending``), built once per shape, with the target, the time, the
    limit and the runs to skip as bound parameters: built anew, its construction and cache key cost more
    CPU than running it."""
    reported = and_(ReportedStateRow.run_pk == RunRow.id, ReportedStateRow.target == bindparam("target"))
    pull_request = and_(PullRequest.repository == RunRow.upstream_repository, PullRequest.number == RunRow.pr_number)
    at_head = PullRequest.head_sha == RunRow.head_sha  # label and level changes re-decide a PR's head only
    labels_changed = and_(
        at_head,
        or_(ReportedStateRow.labels_recorded_at.is_(None), ReportedStateRow.labels_recorded_at != PullRequest.recorded_at),
    )
    level_changed = and_(
        at_head, PullRequest.state == "open", BackendRow.level_changed_at.is_not(None),
        or_(ReportedStateRow.level_changed_at.is_(None), ReportedStateRow.level_changed_at != BackendRow.level_changed_at),
    )
    stmt = (
        select(RunRow, ReportedStateRow, PullRequest.labels, PullRequest.recorded_at, BackendRow.level,
               BackendRow.level_changed_at)
        .outerjoin(ReportedStateRow, reported)
        .outerjoin(PullRequest, pull_request)
        .outerjoin(BackendRow, BackendRow.name == RunRow.backend)
        .where(RunRow.updated_at >= bindparam("since"))
        .where(or_(
            ReportedStateRow.run_pk.is_(None),
            ReportedStateRow.run_updated_at.is_(None),
            ReportedStateRow.run_updated_at != RunRow.updated_at,
            labels_changed,
            level_changed,
        ))
    )
    if skipping:
        stmt = stmt.where(RunRow.id.not_in(bindparam("skip", expanding=True)))
    return stmt.order_by(RunRow.updated_at, RunRow.id).limit(bindparam("limit", type_=Integer))


_PENDING = {skipping: _pending_statement(skipping=skipping) for skipping in (False, True)}


def pending(session: Session, target: str, *, since: dt.datetime, limit: int,
            skip: tuple[int, ...] = ()) -> list[PendingReport]:
    """Runs changed since ``since`` whose state, or whose PR's labels at its head, are newer than what
    was last decided for ``target``, or which are at an open PR's head and whose backend's level changed
    after they were decided; oldest change first. ``skip`` leaves out runs waiting for a retry."""
    parameters = {"target": target, "since": since, "limit": limit}
    if skip:
        parameters["skip"] = list(skip)
    out = []
    rows = session.execute(_PENDING[bool(skip)], parameters)
    for run, state, labels, recorded_at, level, level_changed_at in rows:
        pr_labels = None if run.pr_number is None else tuple(labels or ())
        out.append(PendingReport(view(run), pr_labels, recorded_at, None if state is None else _view(state),
                                 level, level_changed_at))
    return out
