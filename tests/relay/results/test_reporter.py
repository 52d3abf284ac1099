"""Upstream reporting against the fake GitHub over real HTTP: check runs with GitHub App auth, commit
statuses with a token; L2 never shown, L3 only with its label (added before the dispatch, during the
run, after the run), L3 failures neutral, L4 real conclusions; states already reported are skipped;
permanent GitHub errors are recorded, not retried."""

import pytest

from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401

LABEL = "ciflow/crcr/l3"


def checks(fake, name):
    return sorted((c for c in fake.check_runs.values() if c["name"] == name), key=lambda c: c["id"])


def statuses(fake, context):
    return [s for s in fake.statuses if s["context"] == context]


def settle(relay):
    assert relay.parts.results.reporting.wait_idle(10)


def test_check_runs_l4_real_conclusion_l3_neutral_l2_nothing(database_url, results_relay, app_mode, wait):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode)
    delivery = drive.open_pr(21, labels=(LABEL,))
    for backend in ("l2", "l3", "l4"):
        nonce = drive.nonce(backend, delivery)
        assert drive.start(backend, nonce).status_code == 200
        settle(relay)
        assert drive.complete(backend, nonce, "failure").status_code == 200
    settle(relay)
    fake = relay.fake
    assert checks(fake, "crcr/l2") == []
    (l4,) = checks(fake, "crcr/l4")
    assert (l4["status"], l4["conclusion"], l4["head_sha"]) == ("completed", "failure", "a" * 40)
    run_id = int(l4["external_id"])
    assert l4["details_url"] == f"http://dashboard.test/runs/{run_id}"
    summary = l4["output"]["summary"]
    assert "| ` collectives ` | 1 | 1 |" in summary and "collectives::test_broadcast" in summary
    assert "AssertionError: rank 1 got 0" in summary
    (l3,) = checks(fake, "crcr/l3")
    assert (l3["status"], l3["conclusion"]) == ("completed", "neutral")
    assert "collectives::test_broadcast" in l3["output"]["summary"]
    # queued was reported when the dispatch was sent (a create); in_progress and completion updated the
    # same check run (a PATCH each)
    methods = [(r.method, r.endpoint) for r in fake.requests if r.endpoint in ("check_runs", "check_run")]
    assert methods.count(("POST", "check_runs")) == 2 and methods.count(("PATCH", "check_run")) == 4


def test_states_already_reported_are_skipped(database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode)
    nonce = drive.nonce("l4", drive.open_pr(22))
    drive.start("l4", nonce)
    drive.complete("l4", nonce, "success")
    settle(relay)
    before = len(relay.fake.requests)
    (run,) = relay.store.runs(backend="l4", pr_number=22)
    assert relay.parts.results.reporter.report_run(run.id) == "unchanged"
    assert len(relay.fake.requests) == before
    assert relay.store.reported_state(run.id, "check_run").state == "completed:success"


@pytest.mark.parametrize("mode", ["app", "token"])
@pytest.mark.parametrize("timing", ["before_dispatch", "during_run", "after_run"])
def test_l3_label_timings_all_end_with_the_check(database_url, results_relay, app_mode, wait, timing, mode):  # noqa: F811
    relay, drive = results_relay(database_url, **(app_mode if mode == "app" else {}))
    fake = relay.fake
    shown = (lambda: checks(fake, "crcr/l3")) if mode == "app" else (lambda: statuses(fake, "crcr/l3"))
    delivery = drive.open_pr(23, labels=(LABEL,) if timing == "before_dispatch" else ())
    nonce = drive.nonce("l3", delivery)

    def add_label():
        drive.open_pr(23, action="labeled", label=LABEL, labels=(LABEL,), updated_at="2024-05-01T11:00:00Z")

    assert drive.start("l3", nonce).status_code == 200
    settle(relay)
    if timing == "during_run":
        assert shown() == []
        add_label()
        wait(shown, what="the check to appear when the label is added during the run")
    assert drive.complete("l3", nonce, "failure").status_code == 200
    settle(relay)
    if timing == "after_run":
        assert shown() == []
        add_label()
        wait(shown, what="the check to appear when the label is added after the run")
    if mode == "app":
        final = wait(lambda: [c for c in shown() if c["status"] == "completed"], what="a completed check")
        assert final[-1]["conclusion"] == "neutral" and final[-1]["head_sha"] == "a" * 40
    else:
        final = wait(lambda: [s for s in shown() if s["state"] != "pending"], what="a final status")
        assert final[-1]["state"] == "success"
        assert final[-1]["description"].startswith("neutral (non-blocking)")


def test_commit_statuses_with_a_token(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(24)
    long_failure = [("conformance/suites/test_collectives.py::test_" + "x" * 150, "failed", "boom")]
    nonce = drive.nonce("l4", delivery)
    settle(relay)  # the queued status, written when the dispatch was sent (a start before it would replace it)
    drive.start("l4", nonce)
    settle(relay)
    from tests.relay.results_support import report

    drive.complete("l4", nonce, "failure", report_body=report("l4", long_failure))
    settle(relay)
    sent = statuses(relay.fake, "crcr/l4")
    assert [s["state"] for s in sent] == ["pending", "pending", "failure"]  # queued at dispatch, running, done
    assert sent[0]["description"].startswith("queued")
    assert all(len(s["description"]) <= 140 for s in sent)
    assert sent[-1]["description"].startswith("0 passed, 1 failed; first: collectives::test_xxx")
    assert sent[-1]["target_url"].startswith("http://dashboard.test/runs/")
    assert relay.fake.check_runs == {}
    assert statuses(relay.fake, "crcr/l2") == [] and statuses(relay.fake, "crcr/l3") == []


def test_permanent_github_error_is_recorded_not_retried(database_url, results_relay):  # noqa: F811
    from relay.testing import Fault

    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(25))
    settle(relay)  # the queued status, written when the dispatch was sent
    relay.fake.script(Fault.unprocessable("No commit found for SHA"), endpoint="statuses")
    drive.start("l4", nonce)
    settle(relay)
    (run,) = relay.store.runs(backend="l4", pr_number=25)
    state = relay.store.reported_state(run.id, "status")
    assert state.state == "in_progress" and "No commit found for SHA" in state.last_error
    settle(relay)
    assert [r.answered for r in relay.fake.requests if r.endpoint == "statuses"] == [201, 422]


def test_retryable_github_error_is_retried(database_url, results_relay, wait):  # noqa: F811
    from relay.testing import Fault

    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l4", drive.open_pr(26))
    settle(relay)  # the queued status, written when the dispatch was sent
    relay.fake.script(Fault.rate_limited(retry_after=0), endpoint="statuses")
    drive.start("l4", nonce)
    wait(lambda: len(statuses(relay.fake, "crcr/l4")) == 2, what="the in_progress status after the rate limit")
    assert [r.answered for r in relay.fake.requests if r.endpoint == "statuses"] == [201, 429, 201]


class _ScriptedReporter:
    """The worker's side of a Reporter and its store: ``pending`` run ids stay pending until reported;
    the first report of a run in ``fail`` raises the error given for it. Records each call's time."""

    mode = "status"

    def __init__(self, pending, fail=None):
        import threading

        self.pending = list(pending)
        self.fail = dict(fail or {})
        self.calls: list[tuple[int, float]] = []
        self.store = self
        self._lock = threading.Lock()

    def reports_pending(self, _mode, *, since, limit, skip):
        import types

        from relay.store.reported_states import PendingReport

        with self._lock:
            return [PendingReport(types.SimpleNamespace(id=pk), None, None, None)
                    for pk in self.pending if pk not in skip][:limit]

    def report(self, row):
        import time

        with self._lock:
            self.calls.append((row.run.id, time.monotonic()))
            error = self.fail.pop(row.run.id, None)
            if error is not None:
                raise error
            self.pending.remove(row.run.id)
        return "reported"


def test_worker_retries_a_failed_run_after_its_wait_without_holding_up_the_others():
    from relay.github import RetryableError
    from relay.results.reporter import ReportingWorker

    reporter = _ScriptedReporter([1, 2, 3], fail={1: RetryableError("502 Bad Gateway")})
    worker = ReportingWorker(reporter, poll_seconds=3600, retry_seconds=0.2)
    worker.start()
    try:
        assert worker.wait_idle(10)
    finally:
        worker.stop()
    assert [pk for pk, _ in reporter.calls] == [1, 2, 3, 1]  # the failed run did not hold up the others
    first, second = [at for pk, at in reporter.calls if pk == 1]
    assert second >= first + 0.2  # retried once its wait was over
    assert reporter.pending == []


def test_a_rate_limit_rests_every_report_and_wait_idle_says_so():
    from relay.github import RateLimitedError
    from relay.results.reporter import ReportingWorker

    reporter = _ScriptedReporter([5, 6], fail={5: RateLimitedError("rate limited", wait_seconds=30)})
    worker = ReportingWorker(reporter, poll_seconds=0.05)
    worker.start()
    try:
        assert worker.wait_idle(0.5) is False
        assert [pk for pk, _ in reporter.calls] == [5]  # run 6 waits with it: the credential is shared
    finally:
        worker.stop()


HOSTILE = "x` [link](https://evil.example) ![img](https://evil.example/i.png) <img src=x onerror=alert(1)> @octocat #1 https://bare.example"


def _markdown_dangers(markdown: str) -> list[str]:
    """What GitHub would turn into something other than text: links, images, HTML, mentions, bare URLs."""
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").enable("table").parse(markdown):
        if block.type == "html_block":
            found.append(f"html block {block.content!r}")
        for token in block.children or ():
            if token.type in ("link_open", "image", "html_inline"):
                found.append(f"{token.type} {token.attrs or token.content!r}")
            elif token.type == "text" and token.content.startswith("Full results: http://dashboard.test/runs/"):
                continue  # the relay's own link to its dashboard
            elif token.type == "text" and any(mark in token.content for mark in ("://", "@", "#1", "<")):
                found.append(f"live text {token.content!r}")
    return found


def test_everything_from_a_report_is_inert_in_the_check_run_summary(sqlite_url, results_relay, app_mode):  # noqa: F811
    from tests.relay.results_support import report

    relay, drive = results_relay(sqlite_url, **app_mode)
    nonce = drive.nonce("l4", drive.open_pr(26))
    body = report("l4", [(f"conformance/suites/test_a|b.py::test_{HOSTILE}", "failed", f"boom {HOSTILE}\n```\n{HOSTILE}")])
    body["tests"][0]["suite"] = f"suite|{HOSTILE}"
    body["torch"]["version"] = f"2.13 {HOSTILE}"[:100]  # the report schema bounds it like its column
    assert drive.start("l4", nonce).status_code == 200
    assert drive.complete("l4", nonce, "failure", report_body=body).status_code == 200
    settle(relay)
    (check,) = checks(relay.fake, "crcr/l4")
    summary = check["output"]["summary"]
    assert "evil.example" in summary and "octocat" in summary  # shown, as text
    assert _markdown_dangers(summary) == []
    assert _markdown_dangers("[x](https://a.example) <b>") != []  # the probe itself sees them


def test_status_descriptions_are_plain_one_line_text(sqlite_url, results_relay):  # noqa: F811
    from tests.relay.results_support import report

    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(27))
    drive.start("l4", nonce)
    nodeid = "conformance/suites/test_a.py::test_\x1b[31mred\x07\n\tnext\u202eline"
    drive.complete("l4", nonce, "failure", report_body=report("l4", [(nodeid, "failed", "boom")]))
    settle(relay)
    description = statuses(relay.fake, "crcr/l4")[-1]["description"]
    assert description.startswith("0 passed, 1 failed; first: a::test_")
    assert all(ch.isprintable() for ch in description), repr(description)
    assert "\u202e" not in description and "\x1b" not in description


@pytest.mark.parametrize("tail,expected", [
    # Only the first line fits: it says which step failed, without the colon that led to the lines left out.
    ("Collecting pydantic>=2.6\n" + "ERROR: Could not find a version that satisfies the requirement pydantic " * 3,
     "no report: step 'install-conformance' failed before the suite ran"),
    ("ERROR: no pydantic", "no report: step 'install-conformance' failed before the suite ran; its last lines: "
                           "ERROR: no pydantic"),
])
def test_a_failed_steps_reason_is_its_status_description(sqlite_url, results_relay, tail, expected):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    nonce = drive.nonce("l4", drive.open_pr(28))
    drive.start("l4", nonce)
    message = f"step 'install-conformance' failed before the suite ran; its last lines:\n{tail}"
    assert drive.callback({"nonce": nonce, "state": "completed", "run_id": 5001, "run_attempt": 1,
                           "conclusion": "failure", "message": message}, backend="l4").status_code == 200
    settle(relay)
    assert statuses(relay.fake, "crcr/l4")[-1]["description"] == expected


def test_labels_stored_by_intake_wake_reporting(database_url, results_relay, wait):  # noqa: F811
    # Reporting polls once an hour here: only a wake makes it look. The labeled event names a label no
    # backend listens to, so nothing is dispatched (no send wakes reporting): the PR's stored labels,
    # which now carry the L3 label, are what intake hands over.
    relay, drive = results_relay(database_url, reporting_poll_seconds=3600)
    nonce = drive.nonce("l3", drive.open_pr(25))
    assert drive.start("l3", nonce).status_code == 200
    settle(relay)
    assert statuses(relay.fake, "crcr/l3") == []
    drive.open_pr(25, action="labeled", label="unrelated", labels=(LABEL, "unrelated"), updated_at="2024-05-01T11:00:00Z")
    assert relay.store.outbox_depth()["queued"] == 0
    wait(lambda: statuses(relay.fake, "crcr/l3"), what="the L3 status once intake stored the label")
