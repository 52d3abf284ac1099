"""Backends: the allowlist as last loaded from the descriptors (name, repository, level, label).

Written at start-up and at each descriptor reload (``Store.sync_backends``) from the backend
descriptors' ``relay`` sections; a backend whose descriptor lost its relay section is kept but marked
inactive, so its past dispatches still name a known backend. ``level_changed_at`` is the backend's
level version: set when a sync changes its level, and compared by reporting with the version each
reported state was decided from (``reported_states.pending``), so a level change re-decides the
reports of open PRs through the usual path. Otherwise read by tests and by anyone inspecting the
database; the running relay works from the descriptors it loaded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import Boolean, DateTime, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

if TYPE_CHECKING:
    from relay.trust import BackendTarget

__all__ = ["BackendRecord", "BackendRow"]


class BackendRow(Base):
    __tablename__ = "backends"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    repository: Mapped[str] = mapped_column(String(200))
    level: Mapped[str] = mapped_column(String(4))
    label: Mapped[str] = mapped_column(String(100))
    active: Mapped[bool] = mapped_column(Boolean)
    synced_at: Mapped[dt.datetime] = mapped_column(DateTime)
    level_changed_at: Mapped[dt.datetime | None] = mapped_column(DateTime)  # None: never changed since added


@dataclasses.dataclass(frozen=True)
class BackendRecord:
    name: str
    repository: str
    level: str
    label: str
    active: bool = True
    level_changed_at: dt.datetime | None = None


def sync(session: Session, targets: list[BackendTarget], now: dt.datetime) -> dict[str, tuple[str, str]]:
    """Record ``targets``; returns {backend: (old level, new level)} for each level this changed."""
    current = {t.name: BackendRecord(t.name, t.repository, t.level.value, t.label) for t in targets}
    changed = {}
    for row in session.scalars(select(BackendRow).with_for_update()):
        record = current.pop(row.name, None)
        if record is None:
            row.active = False
        else:
            if row.level != record.level:
                changed[row.name] = (row.level, record.level)
                row.level_changed_at = now
            row.repository, row.level, row.label, row.active = record.repository, record.level, record.label, True
        row.synced_at = now
    for record in current.values():
        session.add(BackendRow(synced_at=now, **dataclasses.asdict(record)))
    return changed


def all_records(session: Session) -> list[BackendRecord]:
    return [
        BackendRecord(name=r.name, repository=r.repository, level=r.level, label=r.label, active=r.active,
                      level_changed_at=r.level_changed_at)
        for r in session.scalars(select(BackendRow).order_by(BackendRow.name))
    ]
