"""Level review: each backend's runs measured against its level's criteria, and what its level should be.

Triggered by ``relay levels review`` (:mod:`relay.levels.command_line`), the level watch (:mod:`relay.levels.watch`) and the dashboard
(overview and backend pages). Reads finished runs from the store; writes nothing: promotion and
demotion stay reviewed changes to the backend files, this only recommends them (``relay levels
restore <backend>`` ends a backend's level hold: a person's decision, stored with the hold). The
criteria (measure, bar, window) are data in the trust module, :data:`relay.trust.LEVEL_CRITERIA`;
``RELAY_LEVEL_*`` settings override a few bars (:func:`criteria_from_settings`). A backend that
fails one of its level's ``hold`` criteria is recommended for demotion (too few runs: insufficient
data); one that meets every ``hold`` and ``entry`` criterion of the level above is recommended for
promotion, except to a level whose check blocks PRs, which is left to the maintainers.

Counting: a run counts once finished (``completed``, ``timed_out``); ``success`` of the dispatched
commit's torch is a success, every other conclusion, a success of another torch (conformance.provenance)
and every time-out is not; cancelled runs (superseded by a newer run, or the PR was closed) never
count. End to end is ``finished_at - dispatched_at`` (queue + execution); a time-out is over the
time limit whatever its times say.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections.abc import Iterable, Mapping, Sequence

from relay import trust
from relay.store.base import utcnow
from relay.store.runs import RunView
from relay.trust import Comparison, Criterion, LevelCriteria, Measure, TrustLevel

__all__ = [
    "CriterionResult", "LevelReview", "WeekStats", "criteria_from_settings", "measure", "recommend", "review",
    "week_stats", "weekly_history",
]

Criteria = Mapping[TrustLevel, LevelCriteria]
_COUNTED = ("completed", "timed_out")
_DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class WeekStats:
    backend: str
    since: dt.datetime
    until: dt.datetime
    runs: int  # finished runs counted (cancelled left out)
    successes: int
    within_limit: int
    time_to_result_p50: float | None
    time_to_result_max: float | None
    queue_p50: float | None
    execution_p50: float | None

    @property
    def success_rate(self) -> float | None:
        return None if self.runs == 0 else self.successes / self.runs


@dataclasses.dataclass(frozen=True)
class CriterionResult:
    """One criterion of a level, the value measured over its window, and whether it is met (None: no data)."""

    level: str
    measure: str
    comparison: str
    bar: float
    window_days: int
    value: float | None
    met: bool | None
    entry: bool  # an entry criterion of the level above (promotion), not a hold criterion of the current one

    @property
    def label(self) -> str:
        return _label(self.measure)

    @property
    def value_text(self) -> str:
        return _show(self.measure, self.value)

    @property
    def bar_text(self) -> str:
        return _bar_text(self)

    def describe(self) -> str:
        return f"{self.label} {self.value_text} ({self.bar_text})"


@dataclasses.dataclass(frozen=True)
class LevelReview:
    backend: str
    level: str
    stats: WeekStats
    recommendation: str  # promote | demote | keep | insufficient_data
    recommended_level: str
    reason: str
    criteria: tuple[CriterionResult, ...] = ()


_LABELS = {
    Measure.runs: "runs", Measure.days_of_data: "days of data", Measure.days_at_level: "days at level",
    Measure.success_rate: "success rate", Measure.queue_mean_seconds: "average queue",
    Measure.queue_p90_seconds: "p90 queue", Measure.end_to_end_p50_seconds: "end-to-end p50",
    Measure.end_to_end_p90_seconds: "end-to-end p90", Measure.time_out_rate: "time-out rate",
    Measure.over_time_limit_rate: "runs over the time limit",
}
_RATES = (Measure.success_rate, Measure.time_out_rate, Measure.over_time_limit_rate)
_COMPARISON_TEXT = {Comparison.above: "above", Comparison.below: "under", Comparison.at_least: "at least"}


def _label(measure: str) -> str:
    return _LABELS[Measure(measure)]


def _show(measure: str, value: float | None) -> str:
    if value is None:
        return "unknown"
    m = Measure(measure)
    if m in _RATES:
        return f"{value:.1%}".replace(".0%", "%")
    if m.value.endswith("_seconds"):
        return f"{value / 60:.1f} min" if value < 2 * 3600 else f"{value / 3600:.1f} h"
    return f"{value:.0f}"  # runs, days


def _bar_text(result: CriterionResult) -> str:
    window = "" if Measure(result.measure) is Measure.days_at_level else f" over {result.window_days} days"
    return f"{_COMPARISON_TEXT[Comparison(result.comparison)]} {_show(result.measure, result.bar)}{window}"


def _time_to_result(run: RunView) -> float | None:
    if run.finished_at is None:
        return None
    return max(0.0, (run.finished_at - run.dispatched_at).total_seconds())


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _p90(values: list[float]) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _counted(backend: str, runs: Iterable[RunView]) -> list[RunView]:
    """The backend's finished runs, one per dispatch: a dispatch's latest attempt stands for it, so
    re-running one dispatch downstream many times never counts as many runs."""
    latest: dict[int, RunView] = {}
    for run in runs:
        if run.backend != backend or run.state not in _COUNTED:
            continue
        known = latest.get(run.dispatch_id)
        if known is None or ((run.run_attempt or 0), run.id) > ((known.run_attempt or 0), known.id):
            latest[run.dispatch_id] = run
    return sorted(latest.values(), key=lambda r: r.id)


def _success(run: RunView) -> bool:
    return run.state == "completed" and run.conclusion == "success" and not run.provenance_problem


def _over_limit(run: RunView, limit: float) -> bool:
    if run.state == "timed_out":
        return True
    time = _time_to_result(run)
    return time is not None and time > limit


def measure(which: Measure, counted: Sequence[RunView], *, now: dt.datetime, time_limit_seconds: float,
            level_since: dt.date | None = None) -> float | None:
    """The value of one measure over ``counted`` (finished runs of one backend within the window)."""
    n = len(counted)
    if which is Measure.runs:
        return float(n)
    if which is Measure.days_at_level:
        if level_since is None:
            return None
        return (now - dt.datetime.combine(level_since, dt.time())).total_seconds() / _DAY
    if which is Measure.days_of_data:
        return (now - min(r.dispatched_at for r in counted)).total_seconds() / _DAY if counted else None
    if n == 0:
        return None
    if which is Measure.success_rate:
        return sum(map(_success, counted)) / n
    if which is Measure.time_out_rate:
        return sum(1 for r in counted if r.state == "timed_out") / n
    if which is Measure.over_time_limit_rate:
        return sum(1 for r in counted if _over_limit(r, time_limit_seconds)) / n
    queues = [q for q in (r.queue_seconds for r in counted) if q is not None]
    ends = [t for t in map(_time_to_result, counted) if t is not None]
    if which is Measure.queue_mean_seconds:
        return statistics.fmean(queues) if queues else None
    if which is Measure.queue_p90_seconds:
        return _p90(queues)
    if which is Measure.end_to_end_p50_seconds:
        return _p50(ends)
    return _p90(ends)


def _assess(level: TrustLevel, checks: Iterable[Criterion], level_criteria: LevelCriteria, runs: Sequence[RunView],
            backend: str, now: dt.datetime, level_since: dt.date | None, entry: bool) -> list[CriterionResult]:
    out = []
    for c in checks:
        since = now - dt.timedelta(days=c.window_days)
        counted = _counted(backend, (r for r in runs if since <= r.dispatched_at <= now))
        value = measure(c.measure, counted, now=now, time_limit_seconds=level_criteria.time_limit_seconds,
                        level_since=level_since)
        out.append(CriterionResult(level.value, c.measure.value, c.comparison.value, c.bar, c.window_days, value,
                                   c.met(value), entry))
    return out


def week_stats(backend: str, runs: Iterable[RunView], since: dt.datetime, until: dt.datetime,
               time_limit_seconds: float = 3 * 3600.0) -> WeekStats:
    counted = _counted(backend, runs)
    times = [t for t in map(_time_to_result, counted) if t is not None]
    return WeekStats(
        backend=backend, since=since, until=until, runs=len(counted), successes=sum(map(_success, counted)),
        within_limit=sum(1 for r in counted if not _over_limit(r, time_limit_seconds)),
        time_to_result_p50=_p50(times), time_to_result_max=max(times) if times else None,
        queue_p50=_p50([q for q in (r.queue_seconds for r in counted) if q is not None]),
        execution_p50=_p50([e for e in (r.execution_seconds for r in counted) if e is not None]),
    )


def recommend(level: TrustLevel | str, runs: Sequence[RunView], backend: str, *, criteria: Criteria | None = None,
              now: dt.datetime | None = None, level_since: dt.date | None = None,
              ) -> tuple[str, str, str, tuple[CriterionResult, ...]]:
    """(recommendation, recommended level, reason, every criterion's result) for one backend's runs."""
    level = TrustLevel(level)
    table = criteria if criteria is not None else trust.LEVEL_CRITERIA
    now = now or utcnow()
    name = level.value
    if not trust.switches(level).accepts_results:
        up = trust.lowest_accepting_results()
        advice = f"promote to {up.value} by review to start measuring" if up else "no level sends results back"
        return "keep", name, f"{name} backends send no results back; {advice}", ()
    own = table[level]
    held = _assess(level, own.hold, own, runs, backend, now, level_since, entry=False)
    up = trust.higher(level)
    ahead: list[CriterionResult] = []
    if up is not None:
        nxt = table[up]
        ahead = _assess(up, (*nxt.hold, *nxt.entry), nxt, runs, backend, now, level_since, entry=True)
    results = tuple(held + ahead)
    scarce = [r for r in held if Measure(r.measure) is Measure.runs and not r.met]
    if scarce:
        return "insufficient_data", name, f"{scarce[0].describe()}: too few to judge {name}", results
    failing = [r for r in held if r.met is False or r.met is None]
    if failing:
        lower = trust.lower(level) or level
        return "demote", lower.value, "; ".join(f"{r.describe()} misses the {name} bar" for r in failing), results
    if up is None:
        return "keep", name, f"meets every {name} criterion", results
    short = [r for r in ahead if not r.met]
    if short:
        return "keep", name, (f"meets every {name} criterion; not yet {up.value}: "
                              + "; ".join(r.describe() for r in short)), results
    if trust.switches(up).block_pr:
        return "keep", name, (f"meets every {up.value} criterion ({up.value} makes the check required: "
                              "a maintainers' decision)"), results
    return "promote", up.value, f"meets every {up.value} criterion", results


def review(store, backends: Sequence[trust.BackendTarget], *, criteria: Criteria | None = None,
           now: dt.datetime | None = None) -> list[LevelReview]:
    """review(store, targets) -> one LevelReview per backend, each criterion over its own window."""
    table = criteria if criteria is not None else trust.LEVEL_CRITERIA
    until = now or utcnow()
    days = max(c.window_days for c in table.values())
    runs = store.runs(since=until - dt.timedelta(days=days), until=until)
    week = until - dt.timedelta(days=7)
    out = []
    for target in backends:
        rec, new_level, reason, results = recommend(target.level, runs, target.name, criteria=table, now=until,
                                                    level_since=target.level_since)
        stats = week_stats(target.name, [r for r in runs if r.dispatched_at >= week], week, until,
                           table[target.level].time_limit_seconds)
        out.append(LevelReview(target.name, target.level.value, stats, rec, new_level, reason, results))
    return out


def weekly_history(store, backend: str, *, weeks: int = 8, now: dt.datetime | None = None,
                   time_limit_seconds: float = 3 * 3600.0) -> list[WeekStats]:
    """Oldest first: one WeekStats per 7-day window ending at ``now``."""
    until = now or utcnow()
    since = until - dt.timedelta(days=7 * weeks)
    runs = store.runs(backend=backend, since=since, until=until)
    out = []
    for i in range(weeks, 0, -1):
        start, end = until - dt.timedelta(days=7 * i), until - dt.timedelta(days=7 * (i - 1))
        out.append(week_stats(backend, [r for r in runs if start <= r.dispatched_at < end], start, end,
                              time_limit_seconds))
    return out


def format_table(reviews: Sequence[LevelReview]) -> str:
    header = f"{'backend':<16} {'level':<5} {'runs':>5} {'success':>8} {'p50 result':>11} {'max result':>11}  recommendation"
    lines = [header, "-" * len(header)]
    for r in reviews:
        rate = "-" if r.stats.success_rate is None else f"{r.stats.success_rate:.0%}"
        p50 = "-" if r.stats.time_to_result_p50 is None else f"{r.stats.time_to_result_p50 / 60:.1f} min"
        worst = "-" if r.stats.time_to_result_max is None else f"{r.stats.time_to_result_max / 60:.1f} min"
        move = r.recommendation if r.recommended_level == r.level else f"{r.recommendation} -> {r.recommended_level}"
        lines.append(f"{r.backend:<16} {r.level:<5} {r.stats.runs:>5} {rate:>8} {p50:>11} {worst:>11}  {move}: {r.reason}")
        for c in r.criteria:
            mark = {True: "met", False: "MISSED", None: "no data"}[c.met]
            scope = f"to enter {c.level}" if c.entry else f"to hold {c.level}"
            lines.append(f"    {mark:<8} {scope:<12} {c.describe()}")
    return "\n".join(lines)


def criteria_from_settings(settings) -> dict[TrustLevel, LevelCriteria]:
    """The criteria table with the ``RELAY_LEVEL_*`` overrides applied: ``level_l2_success_rate`` to L2's
    success-rate bar, ``level_l3_success_rate`` to every level shown on PRs, ``level_min_runs`` to every
    runs bar, ``level_max_time_to_result_seconds`` to every time limit."""

    def override(level: TrustLevel, c: Criterion) -> Criterion:
        if c.measure is Measure.runs:
            return dataclasses.replace(c, bar=float(settings.level_min_runs))
        if c.measure is Measure.success_rate:
            shown = trust.switches(level).display_on_pr is not trust.DisplayOnPR.never
            return dataclasses.replace(c, bar=settings.level_l3_success_rate if shown else settings.level_l2_success_rate)
        return c

    return {
        level: dataclasses.replace(
            lc, hold=tuple(override(level, c) for c in lc.hold),
            time_limit_seconds=settings.level_max_time_to_result_seconds,
        )
        for level, lc in trust.LEVEL_CRITERIA.items()
    }
