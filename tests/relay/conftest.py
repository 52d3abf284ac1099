"""Fixtures of the relay's tests: a fresh database per test (SQLite and PostgreSQL), the fake GitHub,
backend descriptor folders, a relay app served by uvicorn on loopback, and a tab in Debian's headless
Chromium driven by Playwright (one browser per test module).

The databases of ``database_url``, ``sqlite_url`` and ``postgres_url`` hold the newest schema, copied from
one migrated per test process (``migrated_databases``); ``empty_database_url`` is empty, for the tests
of the migrations themselves.

PostgreSQL: tests connect to ``$RELAY_TEST_POSTGRES_URL`` (default
``postgresql://relay:relay@127.0.0.1:5432/postgres``), a role allowed to CREATE DATABASE; each test
gets a database of its own, dropped when the test is done. When no server answers, the
PostgreSQL variants are skipped with the reason (start one with ``pg_ctlcluster 15 main start``). The databases
live in the tablespace ``$RELAY_TEST_POSTGRES_TABLESPACE`` (default ``relay_scratch``, which ``.ci/postgres``
makes on a RAM disk) when the server has it, else in its default one; set the variable empty for the default.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.relay.helpers import RelayUnderTest, write_backend
from tests.relay.migrated_databases import MigratedPostgres, copy_migrated_sqlite

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
POSTGRES_ADMIN_URL = os.environ.get("RELAY_TEST_POSTGRES_URL", "postgresql://relay:relay@127.0.0.1:5432/postgres")
_postgres_problem: list[str | None] = []


def _postgres_unavailable() -> str | None:
    """Why the shared PostgreSQL server cannot be used, or None; asked once per process. A server that
    is slow to answer on a loaded machine gets three tries: one late answer must not skip every
    PostgreSQL test of a worker."""
    if not _postgres_problem:
        import psycopg

        for attempt in range(3):
            try:
                with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=5, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                _postgres_problem.append(None)
                break
            except psycopg.Error as exc:
                error = exc
                if attempt < 2:
                    time.sleep(1)
        else:
            _postgres_problem.append(
                f"no PostgreSQL at RELAY_TEST_POSTGRES_URL={POSTGRES_ADMIN_URL.split('@')[-1]} "
                f"({str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}); "
                "start it with `pg_ctlcluster 15 main start` and create the role (see .ci/postgres)"
            )
    return _postgres_problem[0]


_TABLESPACE = os.environ.get("RELAY_TEST_POSTGRES_TABLESPACE")  # named: must exist; unset: relay_scratch if there
_POSTGRES = MigratedPostgres(POSTGRES_ADMIN_URL, "relay_scratch" if _TABLESPACE is None else _TABLESPACE or None,
                             tablespace_required=bool(_TABLESPACE))


@pytest.fixture(scope="session", autouse=True)
def _drop_test_databases():
    yield
    _POSTGRES.drop_all()


@pytest.fixture(scope="session")
def _sqlite_templates(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sqlite-templates")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request, tmp_path: Path):
    """Every store-touching test runs twice: on a SQLite file and on a fresh PostgreSQL database, each at the
    newest schema revision."""
    if request.param == "sqlite":
        yield copy_migrated_sqlite(request.getfixturevalue("_sqlite_templates"), tmp_path / "relay.db")
        return
    yield from _fresh_postgres_url(migrated=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database_url(request, tmp_path: Path):
    """As ``database_url``, but empty: for the tests of the migrations themselves."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'relay.db'}"
        return
    yield from _fresh_postgres_url(migrated=False)


@pytest.fixture
def sqlite_url(tmp_path: Path, _sqlite_templates: Path) -> str:
    """For tests of the HTTP layer only (signatures, headers), which do not depend on the database."""
    return copy_migrated_sqlite(_sqlite_templates, tmp_path / "relay.db")


@pytest.fixture
def postgres_url():
    yield from _fresh_postgres_url(migrated=True)


@pytest.fixture
def postgres_admin_url() -> str:
    """The shared server's admin URL (a role allowed to CREATE DATABASE); skipped when no server answers."""
    _skip_without_postgres()
    return POSTGRES_ADMIN_URL


def _skip_without_postgres() -> None:
    """Skip without a server, or fail where ``RELAY_TEST_POSTGRES_REQUIRED=1`` says one was started (CI)."""
    problem = _postgres_unavailable()
    if problem and os.environ.get("RELAY_TEST_POSTGRES_REQUIRED") == "1":
        pytest.fail(f"RELAY_TEST_POSTGRES_REQUIRED=1, but {problem}")
    if problem:
        pytest.skip(problem)


def _fresh_postgres_url(*, migrated: bool):
    """A database of the test's own: a copy of this process's migrated template, or (not ``migrated``) empty;
    dropped once the test is torn down (``pytest_runtest_teardown``)."""
    _skip_without_postgres()
    url = _POSTGRES.copy() if migrated else _POSTGRES.empty()
    yield url
    _POSTGRES.release(url)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Drop the databases of the test just torn down. Not in their fixture's teardown: a relay that a test
    started with ``relay_factory`` before asking for its database is stopped after that fixture ends. Nor at
    the end of the session: a worker's hundred-odd drops took 4-6 s there (each waits for the checkpoint
    that DROP DATABASE forces), while the run's other work had ended."""
    try:
        return (yield)
    finally:
        _POSTGRES.drop_released()


@pytest.fixture
def store(database_url):
    """A migrated store on each database; closed (pending writes committed) at teardown."""
    from relay.store import Store

    store = Store(database_url)
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def fake_github():
    from relay.testing import FakeGitHub

    with FakeGitHub() as fake:
        yield fake


@pytest.fixture
def backends_dir(tmp_path: Path) -> Path:
    """Four backends, one per trust level (l1..l4 -> org/l1-ci..org/l4-ci), plus one without a relay section."""
    folder = tmp_path / "backends"
    folder.mkdir()
    for level in ("L1", "L2", "L3", "L4"):
        write_backend(folder, level.lower(), f"org/{level.lower()}-ci", level)
    write_backend(folder, "local", None, None)
    return folder


@pytest.fixture
def relay_factory(fake_github, backends_dir: Path):
    """relay_factory(database_url, **settings) -> a started RelayUnderTest (stopped at teardown)."""
    started: list[RelayUnderTest] = []

    def start(database_url: str, **overrides) -> RelayUnderTest:
        relay = RelayUnderTest.start(database_url, fake_github, backends_dir, **overrides)
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def wait():
    return wait_until


@pytest.fixture(scope="module")
def browser():
    """One Chromium (and one Playwright driver) for the module: starting both costs about a second of CPU."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A tab in a browser context of its own (no cookies, storage or cache from another test), closed with it."""
    tab = browser.new_page(viewport={"width": 1280, "height": 900})
    dialogs = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.dialogs = dialogs
    yield tab
    tab.close()
