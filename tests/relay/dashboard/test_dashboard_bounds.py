"""Dashboard reads are bounded and never wait for writes: "failing now" comes in pages (each test
once), and on SQLite a read (the dashboard's, and the background passes') still answers while another process
holds the write lock."""

from __future__ import annotations

import datetime as dt
import sqlite3


from relay.results.reporter import CHECK_RUN
from relay.store.base import utcnow
from relay.testing import loopback_client
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import REPOS, report

FAILING = [f"conformance/suites/test_collectives.py::test_case_{i:03d}" for i in range(230)]


def _pages(url: str) -> list[list[dict]]:
    pages = []
    while url:
        answer = loopback_client().get(url, timeout=30)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())
        url = answer.links.get("next", {}).get("url")
        assert len(pages) < 10, "pagination does not end"
    return pages


def test_failing_tests_come_in_bounded_pages_each_test_once(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(31))
    tests = [(nodeid, "failed", "boom") for nodeid in FAILING] + [
        (f"conformance/suites/test_collectives.py::test_ok_{i}", "passed", "") for i in range(40)]
    assert drive.start("l2", nonce).status_code == 200
    assert drive.complete("l2", nonce, report_body=report("l2", tests)).status_code == 200
    pages = _pages(f"{relay.url}/api/tests/failing?limit=100")
    assert [len(p) for p in pages] == [100, 100, 30]
    seen = [(f["backend"], f["test_id"]) for page in pages for f in page]
    assert len(seen) == len(set(seen)) == len(FAILING)
    assert sorted(t.rsplit("::", 1)[1] for _, t in seen) == [n.rsplit("::", 1)[1] for n in FAILING]
    assert all(f["failures_in_a_row"] == 1 and f["message"] == "boom" for page in pages for f in page)
    html = loopback_client().get(f"{relay.url}/failing", timeout=30).text
    assert "next page" in html


def test_reads_answer_while_another_process_holds_the_sqlite_write_lock(sqlite_url, results_relay):  # noqa: F811
    relay, drive = results_relay(sqlite_url, store_deadline_seconds=2.0)
    drive.open_pr(32)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer elsewhere holds the lock for longer than the store's deadline
    try:
        for path in ("/api/overview", "/api/backends/l2", "/api/tests/failing", "/api/tests/flaky", "/api/quarantine"):
            answer = loopback_client().get(f"{relay.url}{path}", timeout=10)
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        # The background passes' reads do not wait for the lock either (StoreUnavailable after 2 s).
        pending = relay.store.reports_pending(CHECK_RUN, since=utcnow() - dt.timedelta(days=1), limit=5)
        assert {p.run.backend for p in pending} <= set(REPOS)
        assert relay.store.oidc_identity("l2") is None
        assert relay.store.unhandled_rerun_requests() == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
