"""Pull requests: the latest known labels and head of each upstream PR (L3 label tracking).

Written by intake from every ``pull_request`` event, in the delivery's transaction: each event carries
the PR's full label set, and the newest snapshot (by the PR's own ``updated_at``) wins, so deliveries
arriving out of order cannot bring back a removed label. Read by routing and by reporting
(an L3 backend's check is shown only while its label is on the PR).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Sequence

from sqlalchemy import JSON, Connection, DateTime, Integer, String
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["PullRequest", "PullRequestSnapshot"]


class PullRequest(Base):
    __tablename__ = "pull_requests"

    repository: Mapped[str] = mapped_column(String(200), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    head_sha: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    labels: Mapped[list[str]] = mapped_column(JSON)
    # GitHub's pull_request.updated_at (ISO 8601, UTC, so text order is time order)
    source_updated_at: Mapped[str] = mapped_column(String(32))
    recorded_at: Mapped[dt.datetime] = mapped_column(DateTime)


@dataclasses.dataclass(frozen=True)
class PullRequestSnapshot:
    repository: str
    number: int
    head_sha: str
    state: str
    labels: tuple[str, ...]
    source_updated_at: str
    recorded_at: dt.datetime | None = None  # when the relay stored it (set on reads; the label version)


def upsert_many(connection: Connection, snapshots: Sequence[tuple[PullRequestSnapshot, dt.datetime]]) -> None:
    """Record (snapshot, seen at) pairs in order; per PR the newest ``source_updated_at`` wins, a tie the later one.

    One ``INSERT ... ON CONFLICT DO UPDATE ... WHERE stored <= new`` per PR: atomic on both databases,
    so concurrent writers (several processes on PostgreSQL) cannot bring an older label set back.
    """
    newest: dict[tuple[str, int], tuple[PullRequestSnapshot, dt.datetime]] = {}
    for snapshot, seen_at in snapshots:
        key = (snapshot.repository, snapshot.number)
        if key not in newest or newest[key][0].source_updated_at <= snapshot.source_updated_at:
            newest[key] = (snapshot, seen_at)
    if not newest:
        return
    statement = _upsert_statement(connection.dialect.name)
    # Sorted keys: two batches touching the same PRs lock them in one order (no deadlock on PostgreSQL).
    for key in sorted(newest):
        snapshot, seen_at = newest[key]
        connection.execute(statement, {
            "repository": snapshot.repository, "number": snapshot.number, "head_sha": snapshot.head_sha,
            "state": snapshot.state, "labels": list(snapshot.labels), "source_updated_at": snapshot.source_updated_at,
            "recorded_at": seen_at,
        })


@functools.cache
def _upsert_statement(dialect_name: str):
    # Built once per dialect: constructing the statement costs more than running it.
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    statement = dialect.insert(PullRequest)
    return statement.on_conflict_do_update(
        index_elements=["repository", "number"],
        set_={name: statement.excluded[name] for name in ("head_sha", "state", "labels", "source_updated_at", "recorded_at")},
        where=PullRequest.source_updated_at <= statement.excluded.source_updated_at,
    )


def labels(session: Session, repository: str, number: int) -> tuple[str, ...] | None:
    row = session.get(PullRequest, (repository, number))
    return None if row is None else tuple(row.labels)
