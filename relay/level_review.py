"""Level review: weekly success rate and time-to-result per backend, and what its trust level should be.

Triggered by ``relay levels review`` and by the dashboard (overview and backend pages). Reads finished
runs from the store; writes nothing: promotion and demotion stay reviewed changes to the backend
files, this only recommends them. Bars (configurable, defaults from the upstream relay's RFC
discussion): a success rate above 70 % to hold a level whose results show on the dashboard only (L2),
above 90 % for one whose results show on the PR (L3, L4), and every run finished within 3 hours of its
dispatch. What each level shows, and the order of the levels, come from :data:`relay.trust.LEVELS`; a
promotion to a level whose check blocks PRs is left to the maintainers.

Counting: a run counts once finished (``completed``, ``timed_out``); ``success`` of the dispatched
commit's torch is a success, every other conclusion, a success of another torch (relay.provenance)
and every time-out is not; cancelled runs (superseded by a newer push, or the PR was closed) are left
out. Time to result is ``finished_at - dispatched_at`` (queue + execution).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
from collections.abc import Iterable, Sequence

from relay import trust
from relay.store.base import utcnow
from relay.store.runs import RunView
from relay.trust import DisplayOnPR, TrustLevel

__all__ = ["Bars", "LevelReview", "WeekStats", "recommend", "review", "week_stats", "weekly_history"]


@dataclasses.dataclass(frozen=True)
class Bars:
    l2_success_rate: float = 0.70
    l3_success_rate: float = 0.90
    max_time_to_result_seconds: float = 3 * 3600.0
    min_runs: int = 5


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

    @property
    def all_within_limit(self) -> bool:
        return self.within_limit == self.runs


@dataclasses.dataclass(frozen=True)
class LevelReview:
    backend: str
    level: str
    stats: WeekStats
    recommendation: str  # promote | demote | keep | insufficient_data
    recommended_level: str
    reason: str


def _time_to_result(run: RunView) -> float | None:
    if run.finished_at is None:
        return None
    return max(0.0, (run.finished_at - run.dispatched_at).total_seconds())


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def week_stats(backend: str, runs: Iterable[RunView], since: dt.datetime, until: dt.datetime, bars: Bars) -> WeekStats:
    counted = [r for r in runs if r.backend == backend and r.state in ("completed", "timed_out")]
    times = [t for t in map(_time_to_result, counted) if t is not None]
    return WeekStats(
        backend=backend, since=since, until=until, runs=len(counted),
        successes=sum(1 for r in counted if r.state == "completed" and r.conclusion == "success"
                      and not r.provenance_problem),
        within_limit=sum(1 for t in times if t <= bars.max_time_to_result_seconds),
        time_to_result_p50=_p50(times), time_to_result_max=max(times) if times else None,
        queue_p50=_p50([q for q in (r.queue_seconds for r in counted) if q is not None]),
        execution_p50=_p50([e for e in (r.execution_seconds for r in counted) if e is not None]),
    )


def _bar_for(level: TrustLevel, bars: Bars) -> float:
    """The success rate a level needs: the higher bar once its results show on PRs."""
    shown_on_prs = trust.switches(level).display_on_pr is not DisplayOnPR.never
    return bars.l3_success_rate if shown_on_prs else bars.l2_success_rate


def recommend(level: TrustLevel | str, stats: WeekStats, bars: Bars) -> tuple[str, str, str]:
    """(recommendation, recommended level, reason) for one backend's week."""
    level = TrustLevel(level)
    name = level.value
    if not trust.switches(level).accepts_results:
        up = trust.lowest_accepting_results()
        advice = f"promote to {up.value} by review to start measuring" if up else "no level sends results back"
        return "keep", name, f"{name} backends send no results back; {advice}"
    if stats.runs < bars.min_runs:
        return "insufficient_data", name, f"{stats.runs} finished run(s) this week; at least {bars.min_runs} are needed"
    rate = stats.success_rate or 0.0
    slow = stats.runs - stats.within_limit
    limit_h = bars.max_time_to_result_seconds / 3600
    rate_text = f"success rate {rate:.0%}"
    bar = _bar_for(level, bars)
    if rate <= bar or slow:
        lower = trust.lower(level) or level
        why = []
        if rate <= bar:
            why.append(f"{rate_text} is not above the {bar:.0%} bar of {name}")
        if slow:
            why.append(f"{slow} run(s) took longer than {limit_h:g} h")
        return "demote", lower.value, "; ".join(why)
    up = trust.higher(level)
    if up is not None and rate > _bar_for(up, bars):
        if trust.switches(up).block_pr:
            return "keep", name, f"{rate_text}; meets the {name} bar ({up.value} makes the check required: a maintainers' decision)"
        return "promote", up.value, f"{rate_text} is above the {_bar_for(up, bars):.0%} bar of {up.value} and every run took under {limit_h:g} h"
    return "keep", name, f"{rate_text} meets the {name} bar"


def review(store, backends: Sequence[tuple[str, TrustLevel | str]], *, bars: Bars = Bars(), now: dt.datetime | None = None,
           days: int = 7) -> list[LevelReview]:
    """review(store, [(backend, level)]) -> one LevelReview per backend over the last ``days`` days."""
    until = now or utcnow()
    since = until - dt.timedelta(days=days)
    runs = store.runs(since=since, until=until)
    out = []
    for name, level in backends:
        stats = week_stats(name, runs, since, until, bars)
        rec, new_level, reason = recommend(level, stats, bars)
        out.append(LevelReview(name, TrustLevel(level).value, stats, rec, new_level, reason))
    return out


def weekly_history(store, backend: str, *, weeks: int = 8, bars: Bars = Bars(), now: dt.datetime | None = None) -> list[WeekStats]:
    """Oldest first: one WeekStats per 7-day window ending at ``now``."""
    until = now or utcnow()
    since = until - dt.timedelta(days=7 * weeks)
    runs = store.runs(backend=backend, since=since, until=until)
    out = []
    for i in range(weeks, 0, -1):
        start, end = until - dt.timedelta(days=7 * i), until - dt.timedelta(days=7 * (i - 1))
        out.append(week_stats(backend, [r for r in runs if start <= r.dispatched_at < end], start, end, bars))
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
    return "\n".join(lines)


def bars_from_settings(settings) -> Bars:
    """The bars of ``RELAY_LEVEL_*`` (their defaults are :class:`Bars`'s)."""
    return Bars(
        l2_success_rate=settings.level_l2_success_rate, l3_success_rate=settings.level_l3_success_rate,
        max_time_to_result_seconds=settings.level_max_time_to_result_seconds, min_runs=settings.level_min_runs,
    )


def _review_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["review"], help="review: recommend promotions and demotions")
    parser.add_argument("--days", type=int, default=7, help="window in days (default 7: weekly)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def levels_command(args: argparse.Namespace) -> int:
    from conformance.descriptors import packaged_backends_dir

    from relay.settings import load_settings
    from relay.store import Store
    from relay.trust import load_allowlist

    settings = load_settings()
    allowlist = load_allowlist(settings.backends_dir or packaged_backends_dir())
    store = Store(settings.database_url)
    try:
        store.migrate()
        reviews = review(store, [(t.name, t.level) for t in allowlist], bars=bars_from_settings(settings),
                         days=args.days)
    finally:
        store.close()
    if args.json:
        print(json.dumps([
            {"backend": r.backend, "level": r.level, "recommendation": r.recommendation,
             "recommended_level": r.recommended_level, "reason": r.reason, "runs": r.stats.runs,
             "success_rate": r.stats.success_rate, "time_to_result_p50": r.stats.time_to_result_p50,
             "time_to_result_max": r.stats.time_to_result_max}
            for r in reviews
        ], indent=2))
    else:
        print(format_table(reviews))
    return 0
