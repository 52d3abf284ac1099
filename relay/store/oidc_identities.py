"""OIDC identities: the numeric repository and owner ids a backend's callbacks were first seen with.

A repository name can change hands (deleted and re-created, or its owner renamed), while GitHub's
numeric ids cannot. When a backend's relay section records no ids, the first authenticated OIDC
callback pins the ids its token carries, and every later token must carry the same. Written and read
by callback authentication (:mod:`relay.results.oidc`), through the store.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, DateTime, String, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from relay.store.base import Base

__all__ = ["OidcIdentityRow", "get", "pin"]


class OidcIdentityRow(Base):
    __tablename__ = "oidc_identities"

    backend: Mapped[str] = mapped_column(String(100), primary_key=True)
    repository_id: Mapped[int] = mapped_column(BigInteger)
    repository_owner_id: Mapped[int] = mapped_column(BigInteger)
    pinned_at: Mapped[dt.datetime] = mapped_column(DateTime)


def pin(session: Session, backend: str, repository_id: int, repository_owner_id: int, now: dt.datetime) -> tuple[int, int]:
    """The pinned (repository_id, repository_owner_id) of ``backend``: these, if none were pinned yet.

    ``ON CONFLICT DO NOTHING`` lets the database decide between two first callbacks racing.
    """
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(dialect.insert(OidcIdentityRow).values(
        backend=backend, repository_id=repository_id, repository_owner_id=repository_owner_id, pinned_at=now,
    ).on_conflict_do_nothing(index_elements=["backend"]))
    return get(session, backend)  # type: ignore[return-value]


def get(session: Session, backend: str) -> tuple[int, int] | None:
    row = session.execute(
        select(OidcIdentityRow.repository_id, OidcIdentityRow.repository_owner_id).where(OidcIdentityRow.backend == backend)
    ).first()
    return None if row is None else (row[0], row[1])
