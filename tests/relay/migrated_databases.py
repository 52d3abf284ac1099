"""Databases at the newest schema for the relay's tests, without running the migrations for each test.

Alembic's migrations cost about 55 ms of CPU per database (loading the revision files, compiling their DDL), and
most relay tests start on a database of their own. So each test process migrates one template per dialect the
way the relay does at start (``run_migrations``), and each test gets a copy of it:

* SQLite: a copy of the template's file;
* PostgreSQL: a new schema, in which the statements the template's migration sent are sent again, in order and in
  one transaction. The relay names no schema (it follows ``search_path``), so the same statements build the same
  tables, indexes and version row there. The first copy in each process is compared with the models.

A relay started on a copy still runs its migrations at start: they find the schema current and do nothing. Tests
of the migrations themselves take an empty database (``empty_database_url`` in ``conftest``).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

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
    """Replays, into fresh schemas, what the migration of one empty schema sent to PostgreSQL."""

    def __init__(self):
        self._statements: list[tuple[str, Any, bool]] | None = None
        self._checked = False
        self._lock = threading.Lock()

    def _record(self, url: str) -> list[tuple[str, Any, bool]]:
        from sqlalchemy import event

        from relay.store.database import create_store_engine, run_migrations

        sent: list[tuple[str, Any, bool]] = []
        engine = create_store_engine(url)

        @event.listens_for(engine, "before_cursor_execute")
        def _sent(connection, cursor, statement, parameters, context, executemany):
            sent.append((statement, parameters, executemany))

        try:
            run_migrations(engine)
        finally:
            engine.dispose()
        # The session settings and the advisory lock that let several processes migrate in turn are the
        # migration's own business: a copy is made by one connection in one transaction.
        return [(statement, parameters, many) for statement, parameters, many in sent
                if not statement.lstrip().upper().startswith("SET ") and "pg_advisory" not in statement]

    def migrate(self, empty_schema_url: str, connect_url: str, schema: str) -> None:
        """Bring ``schema`` (empty; ``empty_schema_url`` reaches it) to the newest revision."""
        import psycopg

        with self._lock:
            if self._statements is None:
                self._statements = self._record(empty_schema_url)  # this one is migrated for real
                return
        with psycopg.connect(connect_url, options=f"-csearch_path={schema}") as connection:
            with connection.cursor() as cursor:
                for statement, parameters, many in self._statements:
                    if many:
                        cursor.executemany(statement, parameters)
                    else:
                        cursor.execute(statement, parameters or None)
        with self._lock:
            if not self._checked:
                self._check(empty_schema_url)
                self._checked = True

    @staticmethod
    def _check(url: str) -> None:
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext
        from alembic.script import ScriptDirectory

        from relay.store.database import create_store_engine, migrations_config
        from relay.store.models import Base

        head = ScriptDirectory.from_config(migrations_config()).get_current_head()
        engine = create_store_engine(url)
        try:
            with engine.connect() as connection:
                context = MigrationContext.configure(connection)
                revision, differences = context.get_current_revision(), compare_metadata(context, Base.metadata)
        finally:
            engine.dispose()
        if revision != head or differences:
            raise RuntimeError(f"a replayed migration is at revision {revision} (the newest is {head}) or differs "
                               f"from the models: {differences}")
