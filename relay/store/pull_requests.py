"""Pull requests: the latest known labels and head of each upstream PR (L3 label tracking).

Written by intake from every ``pull_request`` event, in the delivery's transaction: each event carries
the PR's full label set, and the newest snapshot (by the PR's own ``updated_at``) wins, so deliveries
arriving out of order cannot bring back a removed label. Read by routing and, in part 2, by reporting
(an L3 backend's check is shown only while its label is on the PR).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import JSON, DateTime, Integer, String
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


def upsert(session: Session, snapshot: PullRequestSnapshot, now: dt.datetime) -> None:
    row = session.get(PullRequest, (snapshot.repository, snapshot.number), with_for_update=True)
    if row is None:
        session.add(
            PullRequest(
                repository=snapshot.repository, number=snapshot.number, head_sha=snapshot.head_sha,
                state=snapshot.state, labels=list(snapshot.labels), source_updated_at=snapshot.source_updated_at,
                recorded_at=now,
            )
        )
        return
    if snapshot.source_updated_at < row.source_updated_at:
        return  # an older delivery arriving late
    row.head_sha = snapshot.head_sha
    row.state = snapshot.state
    row.labels = list(snapshot.labels)
    row.source_updated_at = snapshot.source_updated_at
    row.recorded_at = now


def labels(session: Session, repository: str, number: int) -> tuple[str, ...] | None:
    row = session.get(PullRequest, (repository, number))
    return None if row is None else tuple(row.labels)
