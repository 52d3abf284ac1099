"""Level holds: a backend at a blocking level that falls below its hold bar is reported non-blocking
(neutral, with the reason and a link to its review) until a person restores it or it is back above
its bar for the configured time; every hold is stored and shown. Real store, fake GitHub over HTTP."""

from __future__ import annotations

from relay.trust import BackendTarget, TrustLevel


def test_a_hold_is_stored_with_its_reason_start_and_end(store):
    store.sync_backends([BackendTarget("l4", "org/l4-ci", TrustLevel.L4, "ciflow/crcr/l4")])
    assert store.current_level_hold("l4") is None
    hold = store.start_level_hold("l4", "L4", "success rate 40% misses the L4 bar")
    assert (hold.backend, hold.level, hold.active, hold.above_since) == ("l4", "L4", True, None)
    again = store.start_level_hold("l4", "L4", "another reason")  # one active hold per backend
    assert (again.id, again.reason) == (hold.id, "success rate 40% misses the L4 bar")
    above = store.mark_level_hold_above_bar("l4")
    assert above.above_since is not None
    assert store.mark_level_hold_above_bar("l4").above_since == above.above_since  # from the first pass above
    assert store.start_level_hold("l4", "L4", "below again").above_since is None  # below again: the clock restarts
    ended = store.end_level_hold("l4", "restored: flaky runner replaced")
    assert (ended.id, ended.active, ended.ended_by, ended.ended_by_person) == (
        hold.id, False, "restored: flaky runner replaced", True)
    assert store.current_level_hold("l4") is None and store.end_level_hold("l4", "x") is None
    second = store.start_level_hold("l4", "L4", "time-out rate 5% misses the L4 bar")
    assert second.id != hold.id
    assert [h.id for h in store.level_holds("l4")] == [second.id, hold.id]  # newest first
    assert store.current_level_hold("l4") == second


# --- end to end: a served relay, the fake GitHub over HTTP -------------------------------------------

import datetime as dt  # noqa: E402

import pytest  # noqa: E402

from relay.levels.watch import LevelWatch, WatchFailed  # noqa: E402
from relay.testing import loopback_client  # noqa: E402
from relay.trust import Comparison, Criterion, LevelCriteria, Measure  # noqa: E402
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: E402,F401

# The watch runs by hand in these tests (watch_once); its own thread's first pass is an hour away.
WATCH = dict(level_watch_seconds=3600, level_min_runs=2)


def run_to_end(drive, relay, backend, number, conclusion):
    nonce = drive.nonce(backend, drive.open_pr(number))
    assert drive.start(backend, nonce).status_code == 200
    assert drive.complete(backend, nonce, conclusion).status_code == 200
    assert relay.parts.results.reporting.wait_idle(30)
    run = relay.store.runs(backend=backend, pr_number=number)[0]
    (check,) = [c for c in relay.fake.check_runs.values() if c["external_id"] == str(run.id)]
    return check


def watch(relay, now=None):
    return relay.parts.results.level_watch.watch_once(now)


def test_a_blocking_backend_below_its_bar_is_reported_neutral_with_the_reason_and_its_review(
        database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **WATCH)
    before = [run_to_end(drive, relay, "l4", n, "failure") for n in (10, 11)]
    assert [c["conclusion"] for c in before] == ["failure", "failure"]
    assert watch(relay)["l4"] == "held"
    hold = relay.store.current_level_hold("l4")
    assert hold.level == "L4" and "success rate 0% (above 90% over 7 days) misses the L4 bar" in hold.reason
    api = loopback_client().get(f"{relay.url}/api/backends/l4").json()
    assert (api["blocks"], api["hold"]["reason"], api["hold"]["active"]) == (False, hold.reason, True)
    assert "Below its L4 bar since" in loopback_client().get(f"{relay.url}/backends/l4").text

    after = run_to_end(drive, relay, "l4", 12, "failure")  # the next run: non-blocking
    assert after["conclusion"] == "neutral"
    summary = after["output"]["summary"]
    assert "**Non-blocking**: below its L4 bar since" in summary and "http://dashboard.test/backends/l4" in summary
    assert "success rate 0%" in summary
    assert [c["conclusion"] for c in before] == ["failure", "failure"]  # what was reported stays
    assert run_to_end(drive, relay, "l4", 13, "success")["conclusion"] == "success"  # a pass is still a pass
    assert watch(relay)["l4"] == "still_held"
    assert [h.id for h in relay.store.level_holds("l4")] == [hold.id]  # one hold, not one per pass


def test_a_person_restores_the_backend_and_it_blocks_again(
        database_url, results_relay, results_backends, app_mode, monkeypatch, capsys):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **WATCH)
    for n in (20, 21):
        run_to_end(drive, relay, "l4", n, "failure")
    assert watch(relay)["l4"] == "held"
    from relay.cli import main

    for name, value in {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "t", "RELAY_DATABASE_URL": database_url,
                        "RELAY_BACKENDS_DIR": str(results_backends)}.items():
        monkeypatch.setenv(name, value)
    assert main(["levels", "restore", "l4"]) == 2
    assert "restore needs the backend and a reason" in capsys.readouterr().err
    assert main(["levels", "restore", "nope", "--reason", "x"]) == 2
    assert "no backend 'nope' in the allowlist" in capsys.readouterr().err
    assert main(["levels", "restore", "l4", "--reason", "runner pool replaced"]) == 0
    assert "ended (restored: runner pool replaced)" in capsys.readouterr().out
    assert main(["levels", "restore", "l4", "--reason", "again"]) == 1
    assert "l4 has no level hold" in capsys.readouterr().err

    (ended,) = relay.store.level_holds("l4")
    assert (ended.active, ended.ended_by) == (False, "restored: runner pool replaced")
    # The person decided on the runs so far: the watch judges only later ones (too few yet).
    assert watch(relay)["l4"] == "too_few_runs" and relay.store.current_level_hold("l4") is None
    assert run_to_end(drive, relay, "l4", 22, "failure")["conclusion"] == "failure"  # blocking again
    api = loopback_client().get(f"{relay.url}/api/backends/l4").json()
    assert api["blocks"] is True and api["hold"] is None
    assert api["holds"][0]["ended_by"] == "restored: runner pool replaced"
    run_to_end(drive, relay, "l4", 23, "failure")
    assert watch(relay)["l4"] == "held"  # two failures after the restore: below its bar again


def test_a_backend_back_above_its_bar_for_the_configured_time_is_no_longer_held(
        database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **WATCH, level_hold_recovery_hours=2,
                                 level_l3_success_rate=0.5)
    for n in (30, 31):
        run_to_end(drive, relay, "l4", n, "failure")
    now = relay.store.runs(backend="l4")[0].finished_at + dt.timedelta(seconds=1)
    assert watch(relay, now)["l4"] == "held"
    for n in (32, 33, 34):
        assert run_to_end(drive, relay, "l4", n, "success")["conclusion"] == "success"
    now = relay.store.runs(backend="l4")[0].finished_at + dt.timedelta(seconds=1)
    assert watch(relay, now)["l4"] == "above_bar"  # 3 of 5: above the 50 % bar, from now
    assert relay.store.current_level_hold("l4").above_since == now
    assert watch(relay, now + dt.timedelta(hours=1))["l4"] == "above_bar"  # not yet the configured 2 h
    assert watch(relay, now + dt.timedelta(hours=2))["l4"] == "recovered"
    (hold,) = relay.store.level_holds("l4")
    assert (hold.ended_by, hold.ended_at) == ("recovered", now + dt.timedelta(hours=2))
    assert run_to_end(drive, relay, "l4", 35, "failure")["conclusion"] == "failure"  # blocking again


def test_a_backend_below_again_restarts_the_time_above_its_bar(database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **WATCH, level_l3_success_rate=0.5)
    for n in (40, 41):
        run_to_end(drive, relay, "l4", n, "failure")
    watch(relay)
    for n in (42, 43, 44):
        run_to_end(drive, relay, "l4", n, "success")
    now = relay.store.runs(backend="l4")[0].finished_at + dt.timedelta(seconds=1)
    assert watch(relay, now)["l4"] == "above_bar"
    for n in (45, 46):
        run_to_end(drive, relay, "l4", n, "failure")  # 3 of 7: below 50 % again
    assert watch(relay)["l4"] == "still_held"
    assert relay.store.current_level_hold("l4").above_since is None


def test_a_backend_that_cannot_be_watched_does_not_stop_the_others(store):
    store.sync_backends([BackendTarget("l3", "org/l3-ci", TrustLevel.L3, "ciflow/crcr/l3"),
                         BackendTarget("l4", "org/l4-ci", TrustLevel.L4, "ciflow/crcr/l4")])
    no_runs_needed = LevelCriteria(hold=(Criterion(Measure.runs, Comparison.at_least, 0),
                                         Criterion(Measure.success_rate, Comparison.above, 0.9)))
    # A criteria table without an L3 row: l3's review raises, l4 is still watched.
    watch_ = LevelWatch(store, [BackendTarget("l3", "org/l3-ci", TrustLevel.L3, "ciflow/crcr/l3"),
                                BackendTarget("l4", "org/l4-ci", TrustLevel.L4, "ciflow/crcr/l4")],
                        criteria={TrustLevel.L4: no_runs_needed}, recovery_seconds=0)
    with pytest.raises(WatchFailed, match=r"l3: KeyError"):
        watch_.watch_once()
    assert store.current_level_hold("l4").reason.startswith("success rate unknown")
    assert store.current_level_hold("l3") is None


def test_a_held_backend_s_commit_status_is_non_blocking_and_links_its_review(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url, **WATCH)
    for number in (50, 51):
        nonce = drive.nonce("l4", drive.open_pr(number, head_sha=f"{number:040d}"))
        drive.start("l4", nonce)
        drive.complete("l4", nonce, "failure", report_body=None)
    assert relay.parts.results.reporting.wait_idle(30)
    assert watch(relay)["l4"] == "held"
    nonce = drive.nonce("l4", drive.open_pr(52, head_sha="5" * 40))
    drive.start("l4", nonce)
    drive.complete("l4", nonce, "failure")
    assert relay.parts.results.reporting.wait_idle(30)
    final = [s for s in relay.fake.statuses if s["context"] == "crcr/l4" and s["sha"] == "5" * 40][-1]
    assert final["state"] == "success" and final["description"].startswith("neutral (non-blocking, below its L4 bar)")
    assert final["target_url"] == "http://dashboard.test/backends/l4"


def test_the_watch_s_thread_waits_an_interval_before_its_first_pass_and_runs_when_woken():
    import threading

    from relay.periodic import PeriodicThread

    passes = threading.Semaphore(0)
    thread = PeriodicThread("first-after-interval", 3600, passes.release, first_after_interval=True)
    thread.start()
    try:
        assert not passes.acquire(timeout=0.3)  # no pass at start
        thread.wake()
        assert passes.acquire(timeout=10)  # woken: the pass runs now
    finally:
        thread.stop()
