"""Scratch PostgreSQL databases, for the relay's tests and benchmarks: made under a fresh name, dropped after.

Triggered by test fixtures and ``bench/`` scripts, never by the relay. Reads an *admin* URL: a role allowed
to CREATE DATABASE, connected to a database other than the scratch one (``postgres``).

Why dropping is not ``DROP DATABASE ... WITH (FORCE)``: FORCE terminates every other backend in the
database first and, for a role that is not a superuser, refuses outright when one of them is an autovacuum
worker ("must be a member of the role whose process is being terminated": the worker belongs to no role).
A database written to for minutes gets autovacuumed, so FORCE failed at random after long runs. Here the
role ends its *own* sessions in the database, then a plain DROP DATABASE asks any autovacuum worker to quit
and waits (up to 5 s, the server's rule) for the ended sessions to go.
"""

from __future__ import annotations

import functools
import re
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from relay.store.database import normalise_url

__all__ = ["ScratchDatabaseInUse", "ScratchTablespaceMissing", "create_scratch_database", "drop_scratch_database"]

# Scratch names are generated here, so a plain identifier suffices and needs no quoting rules.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class ScratchDatabaseInUse(RuntimeError):
    """A scratch database could not be dropped (sessions of another role are still connected to it), or a
    template could not be copied (sessions are connected to it)."""


class ScratchTablespaceMissing(RuntimeError):
    """The tablespace asked for has lost its folder on the server (one on a RAM disk does at a restart)."""


@functools.lru_cache(maxsize=8)
def _admin_engine(admin_url: str):
    """One engine per admin URL for the process, keeping one idle session in the admin's database: a test run
    makes a database per test, and a new engine's first connection costs the server about 30 ms of CPU
    (its login and SQLAlchemy's questions about the server), several times the copy itself."""
    return create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=4,
                         pool_pre_ping=True)  # a server restarted under the same URL (a private test cluster)


def _checked(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a plain lower-case identifier ([a-z_][a-z0-9_]*, at most 63 characters)")
    return name


def create_scratch_database(admin_url: str, prefix: str, *, template: str | None = None,
                            tablespace: str | None = None) -> str:
    """Create ``<prefix>_<12 hex digits>`` as the admin role; return its URL (the admin URL's credentials).

    ``template``: the URL of a database to copy (tables, rows and all), e.g. one migrated once for many tests.
    PostgreSQL copies it file by file (``STRATEGY FILE_COPY``, PostgreSQL 15 and newer; older servers know no
    other way) rather than page by page through the write-ahead log: for a small database, less than half
    the server's CPU. Raises :class:`ScratchDatabaseInUse` when sessions stay connected to the template through
    the server's wait (5 s).

    ``tablespace``: where the server keeps the new database's files (without it: the template's, or the
    server's default). A run that makes hundreds of databases keeps them off the server's disk this way: on
    ext4 without a journal each new file's inode is looked for past every inode deleted in the last 30 s, so
    a copy of about 300 files and its drop cost the server 30-38 ms of CPU, and more as drops piled up, against
    18-19 ms on a RAM disk (``bench/scratch_databases.py``). Raises :class:`ScratchTablespaceMissing` when its
    folder is gone.
    """
    name = _checked(f"{prefix}_{uuid.uuid4().hex[:12]}", "scratch database name")
    statement = f'CREATE DATABASE "{name}"'
    source = None
    if template is not None:
        source = _checked(make_url(template).database or "", "template database name")
        statement += f' TEMPLATE "{source}"'
    if tablespace is not None:
        statement += f' TABLESPACE "{_checked(tablespace, "tablespace name")}"'
    with _admin_engine(admin_url).connect() as connection:
        if source is not None and connection.dialect.server_version_info >= (15,):
            statement += " STRATEGY FILE_COPY"
        try:
            connection.execute(text(statement))
        except DBAPIError as exc:
            sqlstate = getattr(exc.orig, "sqlstate", None)
            if tablespace is not None and sqlstate == "58P01":  # undefined_file: the tablespace's folder
                raise ScratchTablespaceMissing(
                    f"cannot create database {name!r} in tablespace {tablespace!r}: its folder is gone from the "
                    f"server ({str(exc.orig).strip()}); make the tablespace again (DROP TABLESPACE, then CREATE "
                    "TABLESPACE on an existing folder the server's user owns) or choose another"
                ) from exc
            if source is None or sqlstate != "55006":  # object_in_use
                raise
            # Refused after the server's own wait (5 s): sessions just closed are given time to end.
            raise ScratchDatabaseInUse(
                f"cannot copy template database {source!r}: sessions are connected to it; close them (dispose "
                "of its engine) before making copies"
            ) from exc
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_scratch_database(admin_url: str, database_url: str) -> None:
    """Drop the database ``database_url`` names, ending the admin role's own sessions in it first.

    Dropping one that is already gone is not an error. Raises :class:`ScratchDatabaseInUse` when sessions
    of other roles outlive the server's wait.
    """
    name = _checked(make_url(database_url).database or "", "database name")
    with _admin_engine(admin_url).connect() as connection:
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND usename = current_user AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )
        try:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55006":  # object_in_use
                raise
            holders = connection.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"), {"name": name}
            ).scalar_one()
            raise ScratchDatabaseInUse(
                f"cannot drop scratch database {name!r}: {holders} session(s) of other roles are still "
                "connected to it; end them (pg_terminate_backend as their role or a superuser) and drop it again"
            ) from exc
