"""Every dashboard and API read is served from indexes: each GET route of a served relay is called
over HTTP, every SELECT it runs is recorded from the store's engine, and each one's plan (SQLite
``EXPLAIN QUERY PLAN``, PostgreSQL ``EXPLAIN`` with sequential scans priced out) must not read a big
table (runs, per-test results, deliveries, the outbox) whole. The dispatcher's claim is held to the
same rule, since it runs after every send, and so is the re-run watcher's poll."""

from __future__ import annotations

import json
import re
import threading
from urllib.parse import quote

from fastapi.routing import APIRoute
from sqlalchemy import event

from relay.testing import loopback_client
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

BIG = ("runs", "test_results", "deliveries", "dispatches")
# Known and accepted: /metrics and /readyz count the outbox by state, which reads the whole state
# index (the count of sent rows grows with the outbox's history).
ACCEPTED = ("SELECT dispatches.state, count(*) AS count_1 \nFROM dispatches GROUP BY dispatches.state",)
FAILING_ID = "collectives::test_broadcast"


class Recorder:
    """The SELECTs run on ``engine`` by the threads that answer requests (and by this test's thread
    while ``mine`` is set), with their parameters as the driver got them."""

    def __init__(self, engine):
        self.statements: dict[str, object] = {}
        self.mine = False
        self._main = threading.get_ident()
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn, _cursor, statement, parameters, _context, _executemany):
        answering = threading.current_thread().name.startswith("AnyIO")  # FastAPI's thread pool
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and (
                answering or (self.mine and threading.get_ident() == self._main)):
            self.statements.setdefault(statement, parameters)


def _sqlite_problems(connection, statement: str, parameters) -> list[str]:
    plan = [row[3] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
    # A whole index read in order is cut short by the LIMIT only when nothing filters the rows it reads.
    upper = statement.upper()
    bounded = " LIMIT " in upper and " WHERE " not in upper and not any("TEMP B-TREE FOR ORDER BY" in line for line in plan)
    problems = []
    for line in plan:
        match = re.match(r"SCAN (\w+)( USING (COVERING )?INDEX \w+)?", line)
        if match and match.group(1) in BIG and not (match.group(2) and bounded):
            problems.append(line)  # a whole table, or a whole index not cut short by a LIMIT
    return problems


def _postgres_problems(connection, statement: str, parameters) -> list[str]:
    connection.exec_driver_sql("SET enable_seqscan = off")  # an empty table is cheaper to scan: price that out
    try:
        (plan,) = connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar_one()
    finally:
        connection.exec_driver_sql("RESET enable_seqscan")
    problems = []

    def walk(node: dict, under_limit: bool) -> None:
        relation = node.get("Relation Name")
        if relation in BIG:
            whole = node["Node Type"] == "Seq Scan" or (
                node["Node Type"] in ("Index Scan", "Index Only Scan") and "Index Cond" not in node
                and (not under_limit or "Filter" in node))
            if whole:
                problems.append(f"{node['Node Type']} on {relation}" + (f" using {node['Index Name']}" if "Index Name" in node else ""))
        limit = node["Node Type"] == "Limit" or (under_limit and node["Node Type"] not in ("Sort", "Aggregate", "Hash"))
        for child in node.get("Plans", []):
            walk(child, limit)

    walk(plan["Plan"], False)
    return problems


def _plan_problems(engine, statements: dict[str, object]) -> dict[str, list[str]]:
    found = {}
    with engine.connect() as connection:
        for statement, parameters in statements.items():
            if statement in ACCEPTED:
                continue
            check = _sqlite_problems if engine.dialect.name == "sqlite" else _postgres_problems
            problems = check(connection, statement, parameters)
            if problems:
                found[statement] = problems
    return found


def _seed(drive) -> int:
    """Two backends' runs on one PR with results (one test failing on one of them), and a push."""
    delivery = drive.open_pr(7)
    for backend, outcome in (("l2", "failed"), ("l3", "passed")):
        nonce = drive.nonce(backend, delivery)
        assert drive.start(backend, nonce).status_code == 200
        tests = [("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", ""),
                 ("conformance/suites/test_collectives.py::test_broadcast", outcome, "boom" if outcome == "failed" else "")]
        done = drive.complete(backend, nonce, report_body=report(backend, tests))
        assert done.status_code == 200, done.text
    drive.push()
    return done.json()["run"]


def _get_routes(app) -> list[str]:
    """Every GET route's path (the app's routers are included without prefixes)."""
    def walk(routes):
        for route in routes:
            if isinstance(route, APIRoute):
                if "GET" in route.methods and route.path != "/docs":
                    yield route.path
            elif hasattr(route, "original_router"):  # an included router (FastAPI resolves them lazily)
                yield from walk(route.original_router.routes)

    paths = sorted(set(walk(app.routes)))
    assert "/api/overview" in paths and "/failing" in paths, paths
    return paths


def _url_of(path: str, run: int) -> str:
    values = {"{number}": "7", "{name}": "l2", "{run}": str(run), "{test_id:path}": quote(FAILING_ID)}
    for placeholder, value in values.items():
        path = path.replace(placeholder, value)
    assert "{" not in path, f"no value for a parameter of {path}: add one to _url_of"
    return path


def test_every_dashboard_and_api_read_is_served_from_indexes(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    run = _seed(drive)
    relay.wait_settled()
    recorder = Recorder(relay.store.engine)
    for path in _get_routes(relay.app):
        url = _url_of(path, run)
        answer = loopback_client().get(f"{relay.url}{url}", timeout=30, params={"days": 365} if "tests" in path else None)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
    for url in (f"/api/tests/flaky?backend=l2", f"/api/tests/failing?backend=l2&after_backend=l2&after_test=a"):
        assert loopback_client().get(f"{relay.url}{url}", timeout=30).status_code == 200
    recorder.mine = True
    assert relay.store.claim_dispatches("plans", limit=64, lease_seconds=60, max_claims=0) == []
    relay.store.unhandled_rerun_requests()  # the re-run watcher's poll
    recorder.mine = False
    tables = {table for statement in recorder.statements for table in BIG if re.search(rf"\b{table}\b", statement)}
    assert tables == set(BIG), f"the routes read only {sorted(tables)}: the audit saw too little"
    problems = _plan_problems(relay.store.engine, recorder.statements)
    assert not problems, "reads that scan a big table whole:\n" + json.dumps(problems, indent=1)
