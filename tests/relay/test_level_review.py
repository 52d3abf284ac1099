"""Level review: weekly success rate and time to result, the recommendations against the bars, and
``relay levels review`` over a real store."""

import dataclasses
import datetime as dt
import json

import pytest

from relay.level_review import Bars, recommend, week_stats
from relay.store.runs import RunView
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401

T0 = dt.datetime(2024, 5, 1, 10, 0)
BASE = RunView(id=1, dispatch_id=1, delivery_id="d", backend="b", upstream_repository="u/u", event="push",
               pr_number=None, title=None, head_sha="a", head_ref=None, run_id=1, run_attempt=1, run_url=None,
               state="completed", conclusion="success", reason=None, dispatched_at=T0, started_at=T0,
               finished_at=T0 + dt.timedelta(minutes=30), updated_at=T0, summary=None, torch_version=None)


def runs(successes: int, failures: int, slow: int = 0, cancelled: int = 0, timed_out: int = 0) -> list[RunView]:
    out = [dataclasses.replace(BASE, id=i) for i in range(successes)]
    out += [dataclasses.replace(BASE, conclusion="failure") for _ in range(failures)]
    out += [dataclasses.replace(BASE, finished_at=T0 + dt.timedelta(hours=4)) for _ in range(slow)]
    out += [dataclasses.replace(BASE, state="cancelled", conclusion="cancelled") for _ in range(cancelled)]
    out += [dataclasses.replace(BASE, state="timed_out", conclusion="timed_out") for _ in range(timed_out)]
    return out


def stats(*args, **kw):
    return week_stats("b", runs(*args, **kw), T0, T0, Bars())


def test_week_stats_counts_success_and_time_to_result():
    s = stats(8, 1, slow=1, cancelled=3, timed_out=1)
    assert (s.runs, s.successes, s.within_limit) == (11, 9, 10)  # cancelled left out; slow counts as success
    assert s.time_to_result_p50 == 1800 and s.time_to_result_max == 4 * 3600


@pytest.mark.parametrize("level,args,expected", [
    ("L2", (10, 0), ("promote", "L3")),          # 100 % > 90 %, all within 3 h
    ("L2", (8, 2), ("keep", "L2")),              # 80 %: above 70 %, not above 90 %
    ("L2", (7, 3), ("demote", "L1")),            # 70 % is not MORE than 70 %
    ("L3", (19, 1), ("keep", "L3")),             # 95 %
    ("L3", (9, 1), ("demote", "L2")),            # 90 % is not more than 90 %
    ("L3", (19, 0, 1), ("demote", "L2")),        # one run over 3 h
    ("L4", (18, 2), ("demote", "L3")),
    ("L4", (20, 0), ("keep", "L4")),
    ("L2", (3, 0), ("insufficient_data", "L2")),
    ("L1", (0, 0), ("keep", "L1")),
])
def test_recommendations_against_the_bars(level, args, expected):
    rec, new_level, reason = recommend(level, stats(*args), Bars())
    assert (rec, new_level) == expected and reason


def test_bars_are_configurable():
    assert recommend("L2", stats(8, 2), Bars(l3_success_rate=0.75))[:2] == ("promote", "L3")
    assert recommend("L2", stats(8, 2), Bars(l2_success_rate=0.85))[:2] == ("demote", "L1")


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
    assert "promote -> L3" in line["l2"] and "100%" in line["l2"]
    assert "demote -> L3" in line["l4"] and "0%" in line["l4"]
    assert "insufficient_data" in line["l3"] and "keep" in line["l1"]
    assert main(["levels", "review", "--json"]) == 0
    data = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    assert data["l2"]["recommended_level"] == "L3" and data["l2"]["runs"] == 6
