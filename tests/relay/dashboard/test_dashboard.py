"""The dashboard in real headless Chromium (Debian's chromium driven by Playwright): every page renders
with real data, the charts draw, and XSS payloads in a PR title and in a test message stay inert.
The JSON API behind each page is checked over HTTP. Screenshots go to $DASHBOARD_SCREENSHOTS if set."""

import os
from pathlib import Path

import pytest

from relay.testing import loopback_client
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

XSS_TITLE = '<script>window.__xss = "title"</script><img src=x onerror="window.__xss=\'img\'">'
XSS_MESSAGE = '</pre><script>window.__xss = "message"</script><svg onload="window.__xss=\'svg\'">'
SHOTS = os.environ.get("DASHBOARD_SCREENSHOTS")


@pytest.fixture
def seeded(sqlite_url, results_relay):  # noqa: F811
    """A relay with runs on three PRs: l2 passes, l3 and l4 fail, l4 fails with an XSS message."""
    relay, drive = results_relay(sqlite_url)
    for number, head in ((61, "1" * 40), (62, "2" * 40), (63, "3" * 40)):
        delivery = drive.open_pr(number, head_sha=head, title=XSS_TITLE if number == 63 else f"Improve collectives #{number}")
        for backend in ("l2", "l3", "l4"):
            nonce = drive.nonce(backend, delivery)
            assert drive.start(backend, nonce).status_code == 200
            tests = [
                ("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", ""),
                ("conformance/suites/test_collectives.py::test_broadcast",
                 "passed" if backend == "l2" else "failed", "" if backend == "l2" else XSS_MESSAGE),
                ("conformance/suites/test_dtensor.py::test_argmax_ties", "passed", ""),
            ]
            conclusion = "success" if backend == "l2" else "failure"
            body = report(backend, tests, git_version=head)
            assert drive.complete(backend, nonce, conclusion, report_body=body).status_code == 200
    return relay


def visit(page, url: str, shot: str):
    response = page.goto(url)
    assert response.status == 200, f"{url}: {response.status}"
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{shot}.png"), full_page=True)
    return response


def assert_inert(page):
    assert page.evaluate("window.__xss === undefined"), "an injected script ran"
    assert page.dialogs == []


def test_overview(seeded, page):
    visit(page, seeded.url + "/", "overview")
    headers = page.locator("#overview thead th").all_inner_texts()
    assert [h.split()[0] for h in headers[1:]] == ["l2", "l3", "l4"]  # L1 is not displayed
    assert "L3" in headers[2]
    assert page.locator("#overview tbody tr").count() == 3
    assert page.locator("#overview td.cell.ok").count() == 3 and page.locator("#overview td.cell.bad").count() == 6
    assert "l1" in page.locator("p.note").last.inner_text()
    # the XSS title is shown as text, not run
    assert page.get_by_text('<script>window.__xss = "title"</script>', exact=False).count() >= 1
    assert_inert(page)


def test_backend_page_draws_its_charts(seeded, page):
    visit(page, seeded.url + "/backends/l4", "backend")
    page.wait_for_selector("body[data-charts=drawn]", timeout=10_000)
    for chart in ("#chart-pass-rate", "#chart-times"):
        drawn = page.evaluate(f"""() => {{
            const c = document.querySelector('{chart} canvas');
            if (!c) return 0;
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
            return n; }}""")
        assert drawn > 500, f"{chart} has {drawn} drawn pixels"
    assert page.locator("#runs tbody tr").count() == 3
    assert "insufficient data" in page.locator("p.review").inner_text()
    rows = [r.split("\t") for r in page.locator("#criteria tbody tr").all_inner_texts()]
    assert ["hold L4", "runs", "3", "at least 5 over 7 days", "no"] in rows
    assert_inert(page)


def test_pull_request_page_with_cross_backend_diff_and_xss_inert(seeded, page):
    visit(page, seeded.url + "/prs/63", "pull_request")
    diff = page.locator("#diff tbody tr")
    assert diff.count() == 1
    row = diff.first.inner_text()
    assert "collectives::test_broadcast" in row and "l3" in row and "l4" in row and "l2" in row
    assert page.locator("#pr-runs tbody tr").count() == 3
    assert XSS_MESSAGE in page.locator("section.failure pre").first.inner_text()
    assert XSS_TITLE in page.locator("h1 .title").inner_text()
    assert_inert(page)


def test_test_page_and_failing_page(seeded, page):
    visit(page, seeded.url + "/tests/collectives::test_broadcast", "test")
    assert page.locator("#history tbody tr").count() == 9
    assert XSS_MESSAGE in page.locator("#history pre").first.inner_text()
    assert_inert(page)
    visit(page, seeded.url + "/failing", "failing")
    rows = page.locator("#failing tbody tr").all_inner_texts()
    assert len(rows) == 2 and all("1111111111" in r and "#61" in r for r in rows)  # failing since the first PR
    assert_inert(page)


def test_run_page(seeded, page):
    (run,) = seeded.store.runs(backend="l4", pr_number=61)
    visit(page, f"{seeded.url}/runs/{run.id}", "run")
    assert "collectives" in page.locator("table.list").first.inner_text()
    assert page.locator("section.failure").count() == 1
    assert_inert(page)


def test_json_api_behind_every_page(seeded):
    base = seeded.url
    overview = loopback_client().get(f"{base}/api/overview").json()
    assert [b["name"] for b in overview["backends"]] == ["l2", "l3", "l4"] and len(overview["rows"]) == 3
    backend = loopback_client().get(f"{base}/api/backends/l2").json()
    assert backend["level"] == "L2" and len(backend["runs"]) == 3 and backend["runs"][0]["pass_rate"] == 1.0
    criteria = {(c["entry"], c["measure"]): c for c in backend["criteria"]}
    held = criteria[(False, "success_rate")]
    assert (held["level"], held["bar"], held["comparison"], held["value"], held["met"]) == ("L2", 0.7, "above", 1.0, True)
    assert criteria[(True, "days_at_level")]["met"] is None  # the descriptor says no level_since
    pr = loopback_client().get(f"{base}/api/prs/63").json()
    assert pr["title"] == XSS_TITLE and pr["diff"][0]["passing_on"] == ["l2"]
    test = loopback_client().get(f"{base}/api/tests/collectives::test_broadcast").json()
    assert test["latest"] == {"l2": "passed", "l3": "failed", "l4": "failed"}
    failing = loopback_client().get(f"{base}/api/tests/failing").json()
    assert {(f["backend"], f["since_pr"], f["failures_in_a_row"]) for f in failing} == {("l3", 61, 3), ("l4", 61, 3)}
    run = loopback_client().get(f"{base}/api/runs/{pr['runs']['l4'][0]['run']}").json()
    assert run["failures"][0]["message"] == XSS_MESSAGE
    assert loopback_client().get(f"{base}/api/backends/l1").status_code == 404  # L1 is not displayed
    assert loopback_client().get(f"{base}/api/prs/9999").status_code == 404
    paths = loopback_client().get(f"{base}/openapi.json").json()["paths"]
    for path in ("/api/overview", "/api/backends/{name}", "/api/prs/{number}", "/api/tests/{test_id}",
                 "/api/tests/failing", "/api/runs/{run}", "/github/callback"):
        assert path in paths


def test_links_to_a_test_whose_id_has_url_characters(sqlite_url, results_relay, page):  # noqa: F811
    """Parametrised ids may hold '#', '?' or '%': the link must still reach that test's page."""
    relay, drive = results_relay(sqlite_url)
    delivery = drive.open_pr(71, head_sha="7" * 40, title="ids")
    nonce = drive.nonce("l4", delivery)
    assert drive.start("l4", nonce).status_code == 200
    odd = "conformance/suites/test_collectives.py::test_odd[a#b?c=1%2]"
    body = report("l4", [(odd, "failed", "wrong")])
    assert drive.complete("l4", nonce, "failure", report_body=body).status_code == 200
    (run,) = relay.store.runs(backend="l4", pr_number=71)
    visit(page, f"{relay.url}/runs/{run.id}", "run-odd-id")
    page.locator("section.failure h3 a").first.click()
    page.wait_for_load_state()
    assert "collectives::test_odd[a#b?c=1%2]" in page.locator("h1, h2").first.inner_text()
    assert page.locator("#history tbody tr").count() == 1


def test_backend_page_shows_its_level_holds(seeded, page):
    seeded.store.start_level_hold("l4", "L4", "time-out rate 5% misses the L4 bar")
    seeded.store.end_level_hold("l4", "restored: runner pool replaced")
    seeded.store.start_level_hold("l4", "L4", XSS_TITLE)  # shown as text, whatever a reason holds
    visit(page, seeded.url + "/backends/l4", "backend_hold")
    line = page.locator("#hold").inner_text()
    assert line.startswith("Below its L4 bar since ") and "its check is reported non-blocking" in line
    assert XSS_TITLE in line
    rows = [r.split("\t") for r in page.locator("#holds tbody tr").all_inner_texts()]
    assert [(r[0], r[2], r[3]) for r in rows] == [("L4", "active", "-"), ("L4", rows[1][2], "restored: runner pool replaced")]
    assert rows[1][2] != "active"
    assert_inert(page)
