"""Scratch databases for tests and benchmarks: made, copied from a template, dropped with sessions still open, dropped while
autovacuum works in them (what ``DROP DATABASE ... WITH (FORCE)`` refuses a non-superuser), and a drop
that other roles' sessions block is refused by name."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy.engine import make_url

from relay.store import ScratchDatabaseInUse, create_scratch_database, drop_scratch_database
from tests.relay import private_postgres
from tests.relay.migrated_databases import MigratedPostgres

pytestmark = pytest.mark.postgres


def _exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def test_a_scratch_database_is_made_and_dropped_with_its_own_sessions_still_open(postgres_admin_url):
    url = create_scratch_database(postgres_admin_url, "scratch_test")
    name = make_url(url).database
    assert name.startswith("scratch_test_") and _exists(postgres_admin_url, name)
    # A session left open, inside a transaction, as a test's leaked connection would be.
    leaked = psycopg.connect(url)
    leaked.execute("CREATE TABLE t (x int)")
    try:
        drop_scratch_database(postgres_admin_url, url)
        assert not _exists(postgres_admin_url, name)
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")  # its backend was ended
        drop_scratch_database(postgres_admin_url, url)  # already gone: nothing to do
    finally:
        leaked.close()


def test_names_that_are_not_plain_identifiers_are_refused(postgres_admin_url):
    with pytest.raises(ValueError, match=r"scratch database name 'Bad-Prefix_[0-9a-f]{12}' is not a plain lower-case identifier"):
        create_scratch_database(postgres_admin_url, "Bad-Prefix")
    with pytest.raises(ValueError, match=r"database name 'x\"; DROP' is not a plain lower-case identifier"):
        drop_scratch_database(postgres_admin_url, 'postgresql://relay@127.0.0.1/x"; DROP')


def test_a_copy_of_a_template_holds_its_tables_and_rows_and_is_its_own(postgres_admin_url):
    template = create_scratch_database(postgres_admin_url, "scratch_template")
    copies = []
    try:
        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int PRIMARY KEY)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
        copies = [create_scratch_database(postgres_admin_url, "scratch_test", template=template) for _ in range(2)]
        assert len({make_url(url).database for url in copies}) == 2
        with psycopg.connect(copies[0], autocommit=True) as conn:
            assert conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
            conn.execute("INSERT INTO t VALUES (3)")
        with psycopg.connect(copies[1], autocommit=True) as conn:  # the first copy's write is its own
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        for url in [*copies, template]:
            drop_scratch_database(postgres_admin_url, url)


def test_a_template_with_a_session_open_is_refused_with_the_fix(postgres_admin_url):
    template = create_scratch_database(postgres_admin_url, "scratch_template")
    try:
        with psycopg.connect(template):
            with pytest.raises(ScratchDatabaseInUse, match=r"cannot copy template database 'scratch_template_[0-9a-f]{12}': "
                                                           r"sessions are connected to it; close them"):
                create_scratch_database(postgres_admin_url, "scratch_test", template=template)
        with pytest.raises(ValueError, match=r"template database name 'x-y' is not a plain lower-case identifier"):
            create_scratch_database(postgres_admin_url, "scratch_test", template="postgresql://relay@127.0.0.1/x-y")
    finally:
        drop_scratch_database(postgres_admin_url, template)


def test_a_tests_migrated_copy_is_dropped_once_released_and_the_rest_at_the_end(postgres_admin_url):
    """What each PostgreSQL relay test gets (``conftest._fresh_postgres_url``): a copy released at its fixture's
    teardown and dropped after the test's (``drop_released``), even with a store's session still open in it;
    the other copies and the template are left to ``drop_all``."""
    databases = MigratedPostgres(postgres_admin_url)
    first, second = databases.copy(), databases.copy()
    names = {url: make_url(url).database for url in (first, second)}
    try:
        leaked = psycopg.connect(first)
        leaked.execute("SELECT count(*) FROM deliveries")  # migrated: the relay's tables are there
        databases.release(first)
        assert _exists(postgres_admin_url, names[first])  # released, not dropped yet
        databases.drop_released()
        assert not _exists(postgres_admin_url, names[first])
        assert _exists(postgres_admin_url, names[second])
        leaked.close()
        databases.drop_released()  # nothing more was released
        assert _exists(postgres_admin_url, names[second])
    finally:
        template = databases._template
        databases.drop_all()
    assert not _exists(postgres_admin_url, names[second])
    assert not _exists(postgres_admin_url, make_url(template).database)


@pytest.fixture(scope="module")
def cluster_with_eager_autovacuum():
    """A private cluster whose autovacuum visits each database every second, and a non-superuser admin role."""
    problem = private_postgres.unavailable()
    if problem:
        pytest.skip(problem)
    with private_postgres.private_cluster(autovacuum_naptime="1s") as cluster:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE scratch_admin LOGIN CREATEDB")
        yield cluster, make_url(cluster.url).set(username="scratch_admin").render_as_string(hide_password=False)


def _wait_for_other_backend(superuser_url: str, name: str, backend_type: str) -> None:
    deadline = time.monotonic() + 60
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND backend_type = %s", (name, backend_type)
            ).fetchone():
                return
            time.sleep(0.05)
    raise AssertionError(f"no {backend_type} appeared in {name} within 60 s")


def test_a_database_autovacuum_is_working_in_is_dropped(cluster_with_eager_autovacuum):
    cluster, admin_url = cluster_with_eager_autovacuum
    url = create_scratch_database(admin_url, "scratch_test")
    name = make_url(url).database
    with psycopg.connect(url, autocommit=True) as conn:
        # Dead rows to vacuum, and a vacuum slowed to a crawl so the worker is still there at the drop.
        conn.execute(
            "CREATE TABLE t (x int) WITH (autovacuum_vacuum_cost_delay = 100, autovacuum_vacuum_cost_limit = 1, "
            "autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0)"
        )
        conn.execute("INSERT INTO t SELECT generate_series(1, 20000)")
        conn.execute("DELETE FROM t")
    _wait_for_other_backend(cluster.url, name, "autovacuum worker")
    # The hazard is really there: FORCE, as this role, is refused while the worker runs.
    with psycopg.connect(admin_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be a member of the role whose process is being terminated"):
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    drop_scratch_database(admin_url, url)
    assert not _exists(admin_url, name)


def test_a_drop_that_another_roles_session_blocks_is_refused_by_name(cluster_with_eager_autovacuum):
    cluster, admin_url = cluster_with_eager_autovacuum
    url = create_scratch_database(admin_url, "scratch_test")
    name = make_url(url).database
    other_role = make_url(cluster.url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(other_role, autocommit=True):
        with pytest.raises(ScratchDatabaseInUse, match=rf"cannot drop scratch database '{name}': \d+ session\(s\) of other roles"):
            drop_scratch_database(admin_url, url)
        assert _exists(admin_url, name)
    drop_scratch_database(admin_url, url)
    assert not _exists(admin_url, name)
