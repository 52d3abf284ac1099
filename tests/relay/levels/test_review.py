"""Level review: each criterion of the levels table measured over its window, the recommendations, and
``relay levels review`` over a real store."""

import dataclasses
import datetime as dt
import json

import pytest

from relay.levels.review import criteria_from_settings, recommend, week_stats
from relay.trust import LEVEL_CRITERIA, Comparison, Measure, TrustLevel
from relay.store.runs import RunView
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401

T0 = dt.datetime(2024, 5, 1, 10, 0)
BASE = RunView(id=1, dispatch_id=1, delivery_id="d", backend="b", upstream_repository="u/u", event="push",
               pr_number=None, title=None, head_sha="a", head_ref=None, run_id=1, run_attempt=1, run_url=None,
               state="completed", conclusion="success", reason=None, dispatched_at=T0, started_at=T0,
               finished_at=T0 + dt.timedelta(minutes=30), updated_at=T0, summary=None, torch_version=None)


NOW = T0 + dt.timedelta(days=1)
LONG_AGO = (T0 - dt.timedelta(days=60)).date()


def runs(successes: int, failures: int, slow: int = 0, cancelled: int = 0, timed_out: int = 0,
         spread_days: int = 0) -> list[RunView]:
    """Runs of backend "b"; ``spread_days`` spreads their dispatch times over that many days before T0."""
    out = [dataclasses.replace(BASE) for _ in range(successes)]
    out += [dataclasses.replace(BASE, conclusion="failure") for _ in range(failures)]
    out += [dataclasses.replace(BASE, finished_at=T0 + dt.timedelta(hours=4)) for _ in range(slow)]
    out += [dataclasses.replace(BASE, state="cancelled", conclusion="cancelled") for _ in range(cancelled)]
    out += [dataclasses.replace(BASE, state="timed_out", conclusion="timed_out") for _ in range(timed_out)]
    if spread_days:
        # Mixed in time (a fixed permutation), so each window sees every kind in proportion.
        step = dt.timedelta(days=spread_days) / len(out)
        order = sorted(range(len(out)), key=lambda i: (i * 0.6180339887) % 1)
        out = [dataclasses.replace(r, dispatched_at=r.dispatched_at - k * step, started_at=r.started_at - k * step,
                                   finished_at=r.finished_at - k * step) for k, r in zip(order, out)]
    return [dataclasses.replace(r, id=i) for i, r in enumerate(out)]


def test_week_stats_counts_success_and_time_to_result():
    s = week_stats("b", runs(8, 1, slow=1, cancelled=3, timed_out=1), T0, T0)
    assert (s.runs, s.successes, s.within_limit) == (11, 9, 9)  # cancelled left out; slow and timed out are over 3 h
    assert s.time_to_result_p50 == 1800 and s.time_to_result_max == 4 * 3600


def test_criteria_are_data_with_the_ratified_l3_numbers():
    l3 = {c.measure: c for c in LEVEL_CRITERIA[TrustLevel.L3].hold}
    assert (l3[Measure.queue_mean_seconds].bar, l3[Measure.queue_mean_seconds].comparison) == (1800, Comparison.below)
    assert l3[Measure.end_to_end_p50_seconds].bar == 3 * 3600
    assert (l3[Measure.time_out_rate].bar, l3[Measure.time_out_rate].window_days) == (0.01, 7)
    assert (l3[Measure.over_time_limit_rate].bar, l3[Measure.over_time_limit_rate].window_days) == (0.01, 14)
    entry = {c.measure: c for c in LEVEL_CRITERIA[TrustLevel.L3].entry}
    assert entry[Measure.days_at_level].bar == 30 and entry[Measure.days_of_data].bar == 14


def results(level, rs, level_since=LONG_AGO, table=None, now=NOW):
    return recommend(level, rs, "b", criteria=table, now=now, level_since=level_since)


@pytest.mark.parametrize("level,args,expected", [
    ("L2", (10, 0), ("keep", "L2")),             # L3 needs 14 days of data
    ("L2", (30, 0, 0, 0, 0, 20), ("promote", "L3")),
    ("L2", (24, 6, 0, 0, 0, 20), ("keep", "L2")),  # 80 %: above 70 %, not above 90 %
    ("L2", (7, 3), ("demote", "L1")),            # 70 % is not MORE than 70 %
    ("L3", (19, 1), ("keep", "L3")),             # 95 %
    ("L3", (9, 1), ("demote", "L2")),            # 90 % is not more than 90 %
    ("L3", (19, 0, 1), ("demote", "L2")),        # 5 % of runs over 3 h
    ("L3", (99, 0, 0, 0, 1), ("demote", "L2")),  # a 1 % time-out rate is not under 1 %
    ("L3", (99, 0, 0, 5), ("keep", "L3")),       # cancelled (superseded) runs never count
    ("L4", (18, 2), ("demote", "L3")),
    ("L4", (20, 0), ("keep", "L4")),
    ("L3", (30, 0, 0, 0, 0, 20), ("keep", "L3")),  # qualifies for L4, which makes the check required
    ("L2", (3, 0), ("insufficient_data", "L2")),
    ("L1", (0, 0), ("keep", "L1")),
])
def test_recommendations_against_the_criteria(level, args, expected):
    rec, new_level, reason, _ = results(level, runs(*args))
    assert (rec, new_level) == expected and reason


def test_each_criterion_reports_its_value_and_bar():
    rec, _, reason, found = results("L3", runs(19, 0, 1))
    by = {(c.entry, c.measure): c for c in found}
    over = by[(False, "over_time_limit_rate")]
    assert (over.value, over.bar, over.met, over.window_days) == (0.05, 0.01, False, 14)
    assert over.describe() == "runs over the time limit 5% (under 1% over 14 days)"
    assert "runs over the time limit 5% (under 1% over 14 days) misses the L3 bar" in reason
    assert by[(False, "success_rate")].met is True and by[(False, "runs")].value == 20


def test_a_slow_queue_demotes():
    slow_queue = [dataclasses.replace(r, started_at=r.dispatched_at + dt.timedelta(minutes=40),
                                      finished_at=r.dispatched_at + dt.timedelta(minutes=50)) for r in runs(20, 0)]
    rec, new_level, reason, _ = results("L3", slow_queue)
    assert (rec, new_level) == ("demote", "L2") and "average queue 40.0 min (under 30.0 min over 7 days)" in reason


def test_time_at_level_gates_promotion():
    rs = runs(30, 0, spread_days=20)
    rec, _, reason, found = results("L2", rs, level_since=(NOW - dt.timedelta(days=10)).date())
    assert rec == "keep" and "days at level 10 (at least 30)" in reason
    rec, _, reason, _ = results("L2", rs, level_since=None)
    assert rec == "keep" and "days at level unknown" in reason


def test_windows_leave_old_runs_out():
    week = dt.timedelta(days=8)
    old_failures = [dataclasses.replace(r, dispatched_at=r.dispatched_at - week, started_at=r.started_at - week,
                                        finished_at=r.finished_at - week) for r in runs(0, 10)]
    rec, _, _, found = results("L3", runs(20, 0) + old_failures)
    by = {(c.entry, c.measure): c for c in found}
    assert by[(False, "success_rate")].value == 1.0  # the 7-day window
    assert rec == "keep"


def test_settings_override_the_bars():
    from relay.settings import Settings

    def table(**kw):
        return criteria_from_settings(Settings(webhook_secrets="s", github_token="t", database_url="sqlite://", **kw))

    spread = runs(24, 6, spread_days=20)
    assert results("L2", spread, table=table(level_l3_success_rate=0.75))[:2] == ("promote", "L3")
    assert results("L2", spread, table=table(level_l2_success_rate=0.85))[:2] == ("demote", "L1")
    assert results("L2", runs(4, 0), table=table(level_min_runs=3))[0] == "keep"


def test_levels_review_cli(database_url, results_relay, monkeypatch, capsys, results_backends):  # noqa: F811
    relay, drive = results_relay(database_url)
    for number in range(50, 56):  # l2: 6 successes -> promote; l4: 6 failures -> demote
        delivery = drive.open_pr(number)
        for backend, conclusion in (("l2", "success"), ("l4", "failure")):
            nonce = drive.nonce(backend, delivery)
            drive.start(backend, nonce)
            assert drive.complete(backend, nonce, conclusion).status_code == 200
    from relay.cli import main

    for name, value in {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "t", "RELAY_DATABASE_URL": database_url,
                        "RELAY_BACKENDS_DIR": str(results_backends)}.items():
        monkeypatch.setenv(name, value)
    assert main(["levels", "review"]) == 0
    table = capsys.readouterr().out
    line = {row.split()[0]: row for row in table.splitlines()[2:]}
    assert "keep:" in line["l2"] and "100%" in line["l2"]  # L3 needs a month at L2 and 14 days of data
    assert "    no data  to enter L3  days at level unknown (at least 30)" in table
    assert "    MISSED   to hold L4   success rate 0% (above 90% over 7 days)" in table
    assert "demote -> L3" in line["l4"] and "0%" in line["l4"]
    assert "insufficient_data" in line["l3"] and "keep" in line["l1"]
    assert main(["levels", "review", "--json"]) == 0
    data = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    assert data["l2"]["recommended_level"] == "L2" and data["l2"]["runs"] == 6
    held = {c["measure"]: c for c in data["l4"]["criteria"] if not c["entry"]}
    assert (held["success_rate"]["value"], held["success_rate"]["bar"], held["success_rate"]["met"]) == (0.0, 0.9, False)


def test_the_documented_level_since_is_read_from_the_descriptor():
    import re
    from pathlib import Path

    import yaml

    from conformance.descriptors import RelayTarget

    doc = (Path(__file__).resolve().parents[3] / "docs" / "trust-levels.md").read_text()
    section = yaml.safe_load(re.search(r"```yaml\n(.*?)```", doc, re.S).group(1))["relay"]
    assert RelayTarget.model_validate(section).level_since == dt.date(2026, 10, 1)
    with pytest.raises(ValueError, match="level_since"):
        RelayTarget.model_validate({**section, "level_since": "last spring"})
