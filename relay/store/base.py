"""Declarative base shared by every table of the store.

Imported by each concept module (``deliveries``, ``dispatches``, ``runs``, ...) and by the Alembic
environment. A new concept adds a module that subclasses
:class:`Base`, is imported in ``relay/store/models.py``, and ships a new migration under ``migrations/versions``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

# Stable constraint names, so migrations can refer to (and later drop) them on every database.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> dt.datetime:
    """Naive UTC: both SQLite and PostgreSQL store and compare it the same way."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
