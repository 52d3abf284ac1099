"""Databases at the newest schema for the relay's tests, without running the migrations for each test.

Alembic's migrations cost about 55 ms of CPU per database (loading the revision files, compiling their DDL), and
most relay tests start on a database of their own. So each test process migrates one template per dialect the
way the relay does at start (``run_migrations``), and each test gets a copy of it:

* SQLite: a copy of the template's file;
* PostgreSQL: a database copied from the template by the server (``CREATE DATABASE ... TEMPLATE``, file by file).
  Sending the migration's statements again into a fresh schema for each test cost the server 60-100 ms of CPU
  a copy (catalog work for every table, index and constraint); a file copy costs it about 25 ms.

Where the server has a tablespace for them (``MigratedPostgres(..., tablespace=...)``; ``.ci/postgres`` makes one on
a RAM disk), the template and every copy live in it, off the server's disk: see ``create_scratch_database``.

A relay started on a copy still runs its migrations at start: they find the schema current and do nothing. Tests
of the migrations themselves take an empty database (``empty_database_url`` in ``conftest``).
"""

from __future__ import annotations

import functools
import shutil
import threading
from pathlib import Path

__all__ = ["MigratedPostgres", "copy_migrated_sqlite"]


def _migrated_sqlite_template(folder: Path) -> Path:
    from relay.store import Store

    template = folder / "migrated-template.db"
    if not template.exists():
        store = Store(f"sqlite:///{template}")
        store.migrate()  # checkpoints the schema into the file
        store.close()  # and its connections, so that nothing is left in the write-ahead log
        wal = template.with_name(template.name + "-wal")
        if wal.exists() and wal.stat().st_size:
            raise RuntimeError(f"{template}: the migrated schema is still in its write-ahead log, a copy would lose it")
    return template


def copy_migrated_sqlite(template_folder: Path, path: Path) -> str:
    """A SQLite database at ``path`` with the newest schema; returns its URL."""
    shutil.copyfile(_migrated_sqlite_template(template_folder), path)
    return f"sqlite:///{path}"


class MigratedPostgres:
    """MigratedPostgres(admin_url, tablespace=None): scratch databases at the newest revision, each a copy of one
    template that this process migrated for real. ``release(url)`` then ``drop_released()`` drops one a test is
    done with; ``drop_all()`` drops what is left, the template too.

    ``tablespace``: the one to keep the databases in when the server has it and the admin role may create in
    it; otherwise the server's default. ``tablespace_required``: a missing one is an error instead (it was
    asked for by name)."""

    def __init__(self, admin_url: str, tablespace: str | None = None, *, tablespace_required: bool = False):
        self.admin_url = admin_url
        self._tablespace_wanted, self._tablespace_required = tablespace, tablespace_required
        self._template: str | None = None
        self._made: list[str] = []
        self._released: list[str] = []  # made, and done with: dropped at the next drop_released()
        self._lock = threading.RLock()  # copy() makes the template under it, and keeps it like any other

    def empty(self) -> str:
        """A new empty database (for the tests of the migrations themselves); returns its URL."""
        from relay.store import create_scratch_database

        return self._keep(create_scratch_database(self.admin_url, "relay_test", tablespace=self.tablespace))

    def copy(self) -> str:
        """A new database at the newest revision; returns its URL."""
        from relay.store import create_scratch_database

        with self._lock:
            if self._template is None:
                self._template = self._migrated_template()
        return self._keep(create_scratch_database(self.admin_url, "relay_test", template=self._template))

    def release(self, url: str) -> None:
        """The test that had ``url`` is done with it: the next ``drop_released()`` drops it."""
        with self._lock:
            self._released.append(url)

    def drop_released(self) -> None:
        """Drop the released databases; one that fails to drop is left to ``drop_all()``, and so are those
        after it."""
        from relay.store import drop_scratch_database

        with self._lock:
            released, self._released = self._released, []
        for url in released:
            drop_scratch_database(self.admin_url, url)
            with self._lock:
                self._made.remove(url)

    def drop_all(self) -> None:
        from relay.store import drop_scratch_database

        with self._lock:
            made, self._made, self._released, self._template = self._made, [], [], None
        for url in made:
            drop_scratch_database(self.admin_url, url)

    @functools.cached_property
    def tablespace(self) -> str | None:
        """The tablespace the databases are made in, or None for the server's default (asked on first use)."""
        if not self._tablespace_wanted:
            return None
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            usable = conn.execute(
                "SELECT has_tablespace_privilege(oid, 'CREATE') FROM pg_tablespace WHERE spcname = %s",
                (self._tablespace_wanted,)).fetchone()
        if usable and usable[0]:
            return self._tablespace_wanted
        if self._tablespace_required:
            raise RuntimeError(
                f"tablespace {self._tablespace_wanted!r} was asked for, but the server has none of that name that "
                "this role may create databases in: make it (.ci/postgres does) or ask for none")
        return None

    def _keep(self, url: str) -> str:
        with self._lock:
            self._made.append(url)
        return url

    def _migrated_template(self) -> str:
        from relay.store import create_scratch_database
        from relay.store.database import create_store_engine, run_migrations

        template = self._keep(create_scratch_database(self.admin_url, "relay_template", tablespace=self.tablespace))
        engine = create_store_engine(template)
        try:
            run_migrations(engine)
        finally:
            engine.dispose()  # a template with a session open cannot be copied
        return template
