"""The sweeper against a served relay: time-outs for runs that never started or ran too long (and the
upstream check updated), nonce expiry, each reason counted in /metrics."""

import datetime as dt


from relay.store.base import utcnow
from relay.results.sweeper import Sweeper
from relay.testing import loopback_client
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401

HOUR = 3600.0


def sweeper_for(relay, *, at: dt.datetime | None = None, registry=None, **limits):
    values = dict(start_timeout_seconds=HOUR, run_timeout_seconds=3 * 24 * HOUR, nonce_ttl_seconds=7 * 24 * HOUR)
    values.update(limits)
    return Sweeper(relay.store, clock=(lambda: at) if at else utcnow, registry=registry,
                   on_run_changed=relay.parts.results.run_changed, **values)


def test_never_started_times_out_and_the_status_says_so(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    drive.open_pr(41)
    counts = sweeper_for(relay).sweep_once()
    assert counts["never_started"] == 0
    runs = relay.store.runs(pr_number=41)
    assert len(runs) == 4 and {r.state for r in runs} == {"dispatched"}  # one run per backend, made at dispatch
    assert relay.parts.results.reporting.wait_idle(10)  # "queued" reported before the time-out
    later = sweeper_for(relay, at=utcnow() + dt.timedelta(hours=2), registry=relay.parts.metrics.registry)
    counts = later.sweep_once()
    assert counts["never_started"] == 4 and counts["ran_too_long"] == 0
    runs = relay.store.runs(pr_number=41)
    assert {(r.state, r.conclusion, r.reason) for r in runs} == {("timed_out", "timed_out", "never_started")}
    assert relay.parts.results.reporting.wait_idle(10)
    l4 = [s for s in relay.fake.statuses if s["context"] == "crcr/l4"]
    assert [s["state"] for s in l4] == ["pending", "error"] and "timed out" in l4[-1]["description"]
    metrics = loopback_client().get(f"{relay.url}/metrics").text
    assert 'relay_sweeper_actions_total{reason="never_started"} 4.0' in metrics
    assert later.sweep_once()["never_started"] == 0  # nothing left to time out


def test_in_progress_too_long_times_out_and_the_check_run_completes(database_url, results_relay, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode)
    nonce = drive.nonce("l4", drive.open_pr(42))
    assert drive.start("l4", nonce).status_code == 200
    assert sweeper_for(relay, at=utcnow() + dt.timedelta(days=2)).sweep_once()["ran_too_long"] == 0
    counts = sweeper_for(relay, at=utcnow() + dt.timedelta(days=3, minutes=1)).sweep_once()
    assert counts["ran_too_long"] == 1
    (run,) = [r for r in relay.store.runs(pr_number=42) if r.backend == "l4"]
    assert (run.state, run.reason) == ("timed_out", "ran_too_long")
    assert relay.parts.results.reporting.wait_idle(10)
    (check,) = [c for c in relay.fake.check_runs.values() if c["name"] == "crcr/l4"]
    assert (check["status"], check["conclusion"]) == ("completed", "timed_out")
    # a late callback for the timed-out run is refused
    late = drive.complete("l4", nonce, "success")
    assert late.status_code == 409 and late.json()["error"] == "already_timed_out"


def test_timeouts_are_configurable(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(43))
    started = drive.start("l2", nonce)
    assert started.status_code == 200, started.text
    counts = sweeper_for(relay, at=utcnow() + dt.timedelta(minutes=11), run_timeout_seconds=600,
                         start_timeout_seconds=24 * HOUR).sweep_once()
    assert counts["ran_too_long"] == 1 and counts["never_started"] == 0


def test_a_run_whose_key_another_write_references_still_times_out(postgres_url, results_relay):  # noqa: F811
    """A row that references the run (reporting's first reported state, a report's test results) holds
    ``FOR KEY SHARE`` on it until its transaction ends; the sweep must not skip the run for that."""
    import psycopg

    relay, drive = results_relay(postgres_url)
    nonce = drive.nonce("l2", drive.open_pr(44))
    assert drive.start("l2", nonce).status_code == 200
    (run,) = [r for r in relay.store.runs(pr_number=44) if r.backend == "l2"]
    with psycopg.connect(postgres_url) as holder:  # a transaction stays open until the block ends
        holder.execute("SELECT 1 FROM runs WHERE id = %s FOR KEY SHARE", (run.id,))
        counts = sweeper_for(relay, at=utcnow() + dt.timedelta(minutes=11), run_timeout_seconds=600).sweep_once()
    assert counts["ran_too_long"] == 1


def test_nonces_expire_after_their_lifetime(database_url, results_relay):  # noqa: F811
    relay, drive = results_relay(database_url)
    nonce = drive.nonce("l2", drive.open_pr(45))
    assert sweeper_for(relay).sweep_once()["nonce_expired"] == 0
    counts = sweeper_for(relay, at=utcnow() + dt.timedelta(days=8)).sweep_once()
    assert counts["nonce_expired"] == 4
    response = drive.start("l2", nonce)
    assert response.status_code == 410 and response.json()["error"] == "nonce_expired"


def test_the_sweeper_thread_runs_by_itself(database_url, results_relay, wait):  # noqa: F811
    relay, drive = results_relay(database_url, sweeper_enabled=True, sweep_interval_seconds=0.05,
                                 run_start_timeout_seconds=0.2)
    drive.open_pr(46)
    wait(lambda: {r.state for r in relay.store.runs(pr_number=46)} == {"timed_out"},
         what="the sweeper to time out the runs that never started")
