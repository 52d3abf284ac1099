"""Scratch databases for tests and benchmarks: made, copied from a template, dropped with sessions still open, dropped while
autovacuum works in them (what ``DROP DATABASE ... WITH (FORCE)`` refuses a non-superuser), and a drop
that other roles' sessions block is refused by name; databases kept in a tablespace of their own, and one whose folder
is gone named."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from relay.store import ScratchDatabaseInUse, ScratchTablespaceMissing, create_scratch_database, drop_scratch_database
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


def _tablespace_of(admin_url: str, url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return conn.execute("SELECT t.spcname FROM pg_database d JOIN pg_tablespace t ON d.dattablespace = t.oid "
                            "WHERE d.datname = %s", (make_url(url).database,)).fetchone()[0]


@pytest.fixture
def scratch_tablespace(cluster_with_eager_autovacuum):
    """A tablespace ``scratch_files`` in a folder of its own on the private cluster, where the admin role may
    create databases; yields the cluster, the admin URL and the folder."""
    cluster, admin_url = cluster_with_eager_autovacuum
    folder = Path(tempfile.mkdtemp(prefix="relay-pg-tablespace-"))
    shutil.chown(folder, "postgres", "postgres")
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLESPACE scratch_files LOCATION '{folder}'")
        conn.execute("GRANT CREATE ON TABLESPACE scratch_files TO scratch_admin")
    try:
        yield cluster, admin_url, folder
    finally:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("DROP TABLESPACE scratch_files")
        shutil.rmtree(folder, ignore_errors=True)


def test_a_database_made_in_a_tablespace_keeps_its_copies_there_and_a_lost_folder_is_named(scratch_tablespace):
    _, admin_url, folder = scratch_tablespace
    template = create_scratch_database(admin_url, "scratch_template", tablespace="scratch_files")
    made = [create_scratch_database(admin_url, "scratch_test", template=template), template]
    try:
        assert _tablespace_of(admin_url, template) == _tablespace_of(admin_url, made[0]) == "scratch_files"
        assert len([d for version in folder.iterdir() for d in version.iterdir()]) == 2  # their files are there
        made.append(create_scratch_database(admin_url, "scratch_plain"))
        assert _tablespace_of(admin_url, made[-1]) == "pg_default"
        with pytest.raises(ValueError, match=r"tablespace name 'Files' is not a plain lower-case identifier"):
            create_scratch_database(admin_url, "scratch_test", tablespace="Files")
    finally:
        for url in made:
            drop_scratch_database(admin_url, url)
    for version in folder.iterdir():  # as a RAM disk's folder is after a restart
        shutil.rmtree(version)
    with pytest.raises(ScratchTablespaceMissing,
                       match=r"cannot create database 'scratch_test_[0-9a-f]{12}' in tablespace 'scratch_files': its "
                             r"folder is gone from the server \(could not create directory .*\); make the tablespace "
                             r"again"):
        create_scratch_database(admin_url, "scratch_test", tablespace="scratch_files")


def test_the_tests_databases_go_to_the_tablespace_asked_for_when_the_server_has_it(scratch_tablespace,
                                                                                     postgres_admin_url):
    """``MigratedPostgres``: the template and its copies in the tablespace; one the server lacks is the default
    (left as it is), or an error naming it when asked for by name (``RELAY_TEST_POSTGRES_TABLESPACE``)."""
    _, admin_url, _ = scratch_tablespace
    databases = MigratedPostgres(admin_url, "scratch_files")
    try:
        copy, empty = databases.copy(), databases.empty()
        assert databases.tablespace == "scratch_files"
        assert {_tablespace_of(admin_url, url) for url in (databases._template, copy, empty)} == {"scratch_files"}
    finally:
        databases.drop_all()
    assert MigratedPostgres(postgres_admin_url, "no_such_tablespace").tablespace is None
    with pytest.raises(RuntimeError, match=r"tablespace 'no_such_tablespace' was asked for, but the server has none "
                                           r"of that name that this role may create databases in"):
        MigratedPostgres(postgres_admin_url, "no_such_tablespace", tablespace_required=True).tablespace
