"""Database connection: URL handling, engine tuning per dialect, sessions, and migrations at start-up.

Triggered when a :class:`relay.store.Store` is built. Reads the database URL; writes the schema (Alembic
migrations shipped in ``relay/store/migrations``). Plain URLs work: ``sqlite:///relay.db`` and
``postgresql://user@host/db`` (the relay picks the psycopg 3 driver).

SQLite is tuned for one relay process with many threads: WAL journal, a busy timeout, and every
transaction opened with ``BEGIN IMMEDIATE`` so two writers queue instead of failing with "database is
locked" when a read transaction later tries to write. ``synchronous=FULL`` fsyncs the WAL at every
commit, so a webhook answered 2xx survives a power loss too (``NORMAL`` would survive a crash of the
process but could lose the last commits on power loss); intake's group commit pays one fsync per batch
of webhooks, not one per webhook.

Every wait on the database is bounded by the store's deadline (``RELAY_STORE_DEADLINE_SECONDS``), so a
stuck database turns into an error the caller can answer 503 with, never into a hung request: SQLite's
busy timeout; on PostgreSQL the connect timeout, ``statement_timeout`` and ``lock_timeout`` (enforced
by the server) and TCP keepalives (a vanished server breaks the connection instead of hanging it); the
pool's wait for a free connection. A *frozen* server (SIGSTOP, a stalled disk) enforces none of its own
timeouts, which is why intake and ``/readyz`` also put a deadline on their wait (see ``Store``).

Both engines write text by one rule (:mod:`relay.store.storable_text`): U+0000, which PostgreSQL
cannot hold, is written and looked for as U+FFFD.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url

from relay.store import storable_text

__all__ = ["MIGRATIONS_DIR", "READ_ONLY", "create_store_engine", "migrations_config", "normalise_url", "run_migrations"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Execution option marking a read-only transaction (``Store._reading``).
READ_ONLY = "relay_read_only"
# Any constant works; it only has to be the same in every relay process.
_MIGRATION_LOCK_ID = 0x72656C6179  # "relay"


def normalise_url(url: str) -> URL:
    """normalise_url(url) -> URL with an explicit driver (psycopg 3 for PostgreSQL)."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", "psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def create_store_engine(url: str, deadline_seconds: float = 5.0) -> Engine:
    """The engine for ``url``; no connection attempt, statement or lock wait lasts past ``deadline_seconds``."""
    parsed = normalise_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError("RELAY_DATABASE_URL: an in-memory SQLite database cannot be shared; name a file")
        Path(parsed.database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": deadline_seconds},
            pool_size=16,
            max_overflow=32,
            pool_timeout=deadline_seconds,
        )
        _tune_sqlite(engine, deadline_seconds)
        storable_text.install(engine)
        return engine
    if backend == "postgresql":
        engine = create_engine(
            parsed, pool_size=16, max_overflow=32, pool_pre_ping=True, pool_timeout=deadline_seconds,
            connect_args={
                # libpq counts whole seconds and treats 1 as 2.
                "connect_timeout": max(2, math.ceil(deadline_seconds)),
                "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 2,
            },
        )
        _tune_postgresql(engine, deadline_seconds)
        storable_text.install(engine)
        return engine
    raise ValueError(f"RELAY_DATABASE_URL: unsupported database {backend!r}; use sqlite:/// or postgresql://")


def _tune_postgresql(engine: Engine, deadline_seconds: float) -> None:
    milliseconds = max(1, int(deadline_seconds * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # SET rather than the ``options`` connection parameter: a URL may carry its own options.
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {milliseconds}")
            cursor.execute(f"SET lock_timeout = {milliseconds}")
        dbapi_connection.commit()


WAL_CHECKPOINT_PAGES = 64  # 256 KB of log between checkpoints
JOURNAL_SIZE_LIMIT = 1 << 20


def _tune_sqlite(engine: Engine, deadline_seconds: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Hand transaction control to SQLAlchemy's "begin" event below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")  # see the module docstring: durable across power loss
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={max(1, int(deadline_seconds * 1000))}")
        # The log is checkpointed into the database every WAL_CHECKPOINT_PAGES (SQLite's default is 1000,
        # 4 MB): a log that may grow to 4 MB fills a volume with less free, and a checkpoint needs room
        # to grow the database, so once the log has taken the last of it nothing recovers. After a
        # checkpoint the log is cut back to JOURNAL_SIZE_LIMIT instead of keeping its largest size.
        cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        cursor.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # Reads (see READ_ONLY) begin deferred: in WAL mode a reader takes no write lock and never
        # waits for a writer, so the dashboard can neither block intake nor be blocked by it.
        read_only = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def migrations_config() -> Config:
    """Alembic's configuration of the relay's migrations (``MIGRATIONS_DIR``)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def run_migrations(engine: Engine) -> None:
    """Bring the schema to the newest revision; several processes starting at once take turns."""
    config = migrations_config()
    with engine.connect() as connection:
        lock = engine.dialect.name == "postgresql"
        if lock:
            # Another process may be migrating, and a migration may take long: no deadline on this
            # connection (it is discarded afterwards, so the pool never hands out its settings).
            connection.execute(text("SET statement_timeout = 0"))
            connection.execute(text("SET lock_timeout = 0"))
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
            connection.commit()
        try:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()
            if engine.dialect.name == "sqlite":  # the schema into the database file, not left in the log
                # On the driver's connection: outside any transaction (SQLAlchemy's would begin one).
                connection.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            if lock:
                with contextlib.suppress(Exception):
                    connection.rollback()
                    connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})
                    connection.commit()
                connection.invalidate()
