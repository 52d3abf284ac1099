"""Big reports are stored in chunks of their own: a webhook is committed while a maximal report is
being stored (before the report's final transition), and a relay killed between the chunks and that
transition shows none of them; the retried callback shows every test once, and the sweeper deletes
the dead chunks."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from pathlib import Path

import httpx
from sqlalchemy import text

from relay.store import Store, result_batches
from relay.store.database import READ_ONLY
from relay.results.receiver import BIG_CALLBACK_BYTES
from relay.results.sweeper import Sweeper
from relay.testing import loopback_client
from tests.relay.conftest import wait_until
from tests.relay.helpers import SECRET, RelayProcess, pr_payload, push_payload
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import REPOS, TOKENS, report, write_backends

HOUR = 3600.0


def _many_tests(count: int) -> dict:
    return report("l2", [(f"conformance/suites/test_big.py::test_{i}", "failed" if i % 7 == 0 else "passed",
                          "AssertionError: rank 1 got 0" if i % 7 == 0 else "") for i in range(count)])


def _staged_rows(engine) -> int:
    """Results written by a batch not committed yet (read in a read-only transaction of the test's own,
    which on SQLite waits for no writer)."""
    with engine.execution_options(**{READ_ONLY: True}).connect() as connection:
        return connection.execute(text(
            "SELECT count(*) FROM test_results t JOIN result_batches b ON b.id = t.batch")).scalar_one()


def test_a_webhook_is_committed_while_a_maximal_report_is_stored(results_relay, sqlite_url):  # noqa: F811
    relay, drive = results_relay(sqlite_url)  # the default limits: 20 000 tests per report
    nonce = drive.nonce("l2", drive.open_pr(31))
    assert drive.start("l2", nonce).status_code == 200
    (run,) = relay.store.runs(backend="l2", pr_number=31)
    big = _many_tests(relay.parts.settings.callback_max_tests)
    answers: list[httpx.Response] = []
    completing = threading.Thread(target=lambda: answers.append(drive.complete("l2", nonce, report_body=big)))
    observer = relay.store.engine
    # Event order, made certain: once the report's thread has written a chunk, its next transaction waits
    # until the webhook is in (outside any transaction, holding no lock); without this the rest of the
    # report could be stored before the webhook's round trip, on a quiet machine.
    webhook_in, wrote = threading.Event(), threading.local()
    write_chunk, transaction = result_batches.write_chunk, relay.store._transaction

    def counted_chunk(*args, **kwargs):
        wrote.chunks = getattr(wrote, "chunks", 0) + 1
        return write_chunk(*args, **kwargs)

    @contextlib.contextmanager
    def paced_transaction(**kwargs):
        if getattr(wrote, "chunks", 0):
            webhook_in.wait(120)
        with transaction(**kwargs) as session:
            yield session

    result_batches.write_chunk, relay.store._transaction = counted_chunk, paced_transaction
    completing.start()
    try:
        wait_until(lambda: _staged_rows(observer) > 0, timeout=120, what="the report's first chunk")
        # Event order, not clocks: the webhook is answered (its rows committed) while the report is
        # still being stored; before, it waited for the callback's one transaction to commit.
        delivery = str(uuid.uuid4())
        assert relay.post("push", push_payload(after="d" * 40), delivery=delivery).status_code == 202
        assert relay.store.delivery(delivery) is not None
        assert relay.store.run(run.id).state == "in_progress", "the report finished before the webhook got in"
        assert relay.store.test_results([run.id]) == []  # its chunks are not visible before the transition
    finally:
        webhook_in.set()
        completing.join(300)
        result_batches.write_chunk = write_chunk
        del relay.store._transaction
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].json()["tests_recorded"] == len(big["tests"])
    assert relay.store.run(run.id).state == "completed"
    assert len(relay.store.test_results([run.id])) == len(big["tests"])
    with relay.store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM result_batches")).scalar_one() == 0


def _env(database_url: str, fake, backends: Path) -> dict[str, str]:
    fake.tokens.add("ghp_big_reports")
    return {
        "RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_TOKEN": "ghp_big_reports", "RELAY_GITHUB_API_URL": fake.url,
        "RELAY_DATABASE_URL": database_url, "RELAY_BACKENDS_DIR": str(backends), "RELAY_UPSTREAM_REPO": "pytorch/pytorch",
        "RELAY_DISPATCH_POLL_SECONDS": "0.05", "RELAY_SWEEPER_ENABLED": "false",
        "RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0",
    }


def _callback(relay: RelayProcess, body: dict) -> httpx.Response:
    return loopback_client().post(f"{relay.url}/github/callback", json=body, timeout=300,
                      headers={"Authorization": f"Token {TOKENS['l2']}"})


def test_a_relay_killed_between_a_reports_chunks_and_its_transition_shows_none_of_them(
    database_url, fake_github, tmp_path,
):
    backends = write_backends(tmp_path / "backends")
    log = tmp_path / "relay.log"
    relay = RelayProcess(_env(database_url, fake_github, backends), log).start()
    store = Store(database_url)
    try:
        assert relay.post("pull_request", pr_payload(number=41), "big-41").status_code == 202
        wait_until(lambda: fake_github.dispatches(REPOS["l2"]), timeout=30, what="the dispatch to l2")
        nonce = fake_github.dispatches(REPOS["l2"])[-1]["client_payload"]["nonce"]
        started = {"nonce": nonce, "state": "in_progress", "run_id": 9001, "run_attempt": 1}
        assert _callback(relay, started).status_code == 200
        completed = {"nonce": nonce, "state": "completed", "run_id": 9001, "run_attempt": 1, "conclusion": "failure",
                     "report": _many_tests(10_000)}
        answers: list[object] = []

        def send() -> None:
            try:
                answers.append(_callback(relay, completed))
            except httpx.HTTPError as exc:  # the relay died under it: what the kill should cause
                answers.append(exc)

        cut_off = threading.Thread(target=send)
        cut_off.start()
        wait_until(lambda: answers or _staged_rows(store.engine) > 0, timeout=120, what="the report's first chunk")
        assert not answers, f"the report was answered before any chunk was seen: {answers[0]}"
        relay.kill()
        cut_off.join(60)
        assert answers and isinstance(answers[0], httpx.HTTPError), answers
        (run,) = store.runs(backend="l2", pr_number=41)
        assert run.state == "in_progress" and _staged_rows(store.engine) > 0
        assert store.test_results([run.id]) == []  # the chunks written before the kill show nowhere
        assert store.failing_tests(since=run.dispatched_at)[0] == []
    finally:
        relay.stop()

    restarted = RelayProcess(_env(database_url, fake_github, backends), log).start()
    try:
        retried = _callback(restarted, completed)
        assert retried.status_code == 200, retried.text
        assert retried.json()["tests_recorded"] == 10_000
    finally:
        restarted.stop()
    assert len(store.test_results([run.id])) == 10_000  # every test once, none of the dead chunks
    sweeper = Sweeper(store, start_timeout_seconds=HOUR, run_timeout_seconds=HOUR, nonce_ttl_seconds=HOUR)
    assert sweeper.sweep_once()["results_discarded"] == 1
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM test_results")).scalar_one() == 10_000
        assert connection.execute(text("SELECT count(*) FROM result_batches")).scalar_one() == 0
    assert sweeper.sweep_once()["results_discarded"] == 0
    store.close()


def test_a_big_report_for_a_finished_run_is_refused_before_any_chunk_is_written(results_relay, database_url):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(51))
    assert drive.start("l2", nonce).status_code == 200
    assert drive.complete("l2", nonce, "success").status_code == 200
    again = drive.complete("l2", nonce, report_body=_many_tests(2500))
    assert again.status_code == 409 and again.json()["error"] == "already_completed"
    with relay.store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM test_results")).scalar_one() == 2
        assert connection.execute(text("SELECT count(*) FROM result_batches")).scalar_one() == 0


def test_big_callbacks_are_stored_one_at_a_time_and_one_that_waits_too_long_is_told_to_come_back(
        results_relay, sqlite_url):  # noqa: F811
    relay, drive = results_relay(sqlite_url)
    service = relay.parts.callbacks
    service.big_callback_wait_seconds = 0.3
    nonce = drive.nonce("l2", drive.open_pr(61))
    assert drive.start("l2", nonce).status_code == 200
    big = _many_tests(9000)
    assert len(json.dumps(big)) > BIG_CALLBACK_BYTES
    assert service.big_callbacks.acquire(timeout=1)  # another big callback is being stored
    try:
        busy = drive.complete("l2", nonce, report_body=big)
        assert busy.status_code == 503 and busy.json()["error"] == "busy", busy.text
        assert busy.headers["Retry-After"] == "5" and "send this one again in 5 s" in busy.json()["detail"]
        small = drive.nonce("l2", drive.open_pr(62))
        assert drive.start("l2", small).status_code == 200  # small callbacks never wait for it
        assert drive.complete("l2", small, "success").status_code == 200
    finally:
        service.big_callbacks.release()
    done = drive.complete("l2", nonce, report_body=big)  # sent again, as the client does
    assert done.status_code == 200, done.text
    (run,) = relay.store.runs(backend="l2", pr_number=61)
    assert run.state == "completed" and len(relay.store.test_results([run.id])) == 9000
