"""The level watch: a periodic pass that holds a backend found below its level's bar, and ends the
hold once it is back above its bar for the configured time.

Triggered every ``RELAY_LEVEL_WATCH_SECONDS`` by its own thread (started with the app; the first pass
one interval after start), or once by ``watch_once()``. Reads the runs of the longest ``hold``
criterion window (one query) and, per backend, the level review's recommendation
(:func:`relay.levels.review.recommend`, the criteria of :data:`relay.trust.LEVEL_CRITERIA` with the
``RELAY_LEVEL_*`` overrides); writes level holds (:mod:`relay.store.level_holds`). Per backend whose level sends results back:

* below a ``hold`` criterion of its level (the review says demote): a hold is opened with the review's
  reason (or the active one is noted below again). At a blocking level (L4) reporting then reports the
  backend non-blocking from the next decision on (:meth:`relay.trust.BackendTarget.blocks_under`).
* an active hold whose backend meets every ``hold`` criterion again: noted above its bar from this pass;
  ended (``recovered``) once that has lasted ``RELAY_LEVEL_HOLD_RECOVERY_HOURS``. Too few runs to judge
  is neither above nor below: nothing changes.
* a hold ended by a person (``relay levels restore``, or a level change) is their decision: the next
  hold is opened only from runs dispatched after it ended.

Row by row: a backend whose pass raises is logged and the others are still watched.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence

from relay.levels.review import recommend
from relay.periodic import PeriodicThread, ReplicaLease, RunsPeriodically
from relay.store.base import utcnow
from relay.store.errors import StoreUnavailable
from relay.store.level_holds import RECOVERED
from relay.trust import BackendTarget, LevelCriteria, TrustLevel

__all__ = ["LevelWatch", "WatchFailed"]

log = logging.getLogger("relay.level_watch")


class WatchFailed(RuntimeError):
    """The pass failed for some backends (the message names each and its error); the others were watched."""


class LevelWatch(RunsPeriodically):
    """LevelWatch(store, targets, criteria=, recovery_seconds=, interval_seconds=): see the module."""

    def __init__(self, store, targets: Sequence[BackendTarget], *, criteria: Mapping[TrustLevel, LevelCriteria],
                 recovery_seconds: float, interval_seconds: float = 300.0, lease: ReplicaLease | None = None):
        self.store = store
        self.targets = tuple(targets)  # replaced by a descriptor reload
        self.criteria = criteria
        self.recovery = dt.timedelta(seconds=recovery_seconds)
        # The first pass one interval after start: restarts (and replicas starting together) add no burst.
        self._periodic = PeriodicThread("relay-level-watch", interval_seconds, self.watch_once, first_after_interval=True,
                                        lease=lease)

    def watch_once(self, now: dt.datetime | None = None) -> dict[str, str]:
        """One pass; returns {backend: what happened} (``held``, ``still_held``, ``above_bar``,
        ``recovered``, ``meets_bar``, ``too_few_runs``). Raises :class:`WatchFailed` after the pass
        when some backends failed."""
        now = now or utcnow()
        targets = [t for t in self.targets if t.accepts_results]
        # The longest hold window of any level (entry criteria decide promotions, which the watch leaves alone).
        days = max((c.window_days for lc in self.criteria.values() for c in lc.hold), default=0)
        runs = self.store.runs(since=now - dt.timedelta(days=days), until=now) if targets else []
        outcomes: dict[str, str] = {}
        failed: list[str] = []
        for target in targets:
            try:
                outcomes[target.name] = self._watch(target, runs, now)
            except StoreUnavailable:
                raise
            except Exception as exc:  # one bad backend must not stop the others
                log.exception("level watch failed for %s", target.name)
                failed.append(f"{target.name}: {type(exc).__name__}: {exc}")
        if failed:
            raise WatchFailed("; ".join(failed))
        return outcomes

    def _watch(self, target: BackendTarget, runs: list, now: dt.datetime) -> str:
        latest = next(iter(self.store.level_holds(target.name, limit=1)), None)
        active = latest if latest is not None and latest.active else None
        if latest is not None and latest.ended_by_person:
            runs = [r for r in runs if r.dispatched_at > latest.ended_at]  # a person decided on what came before
        recommendation, _, reason, _ = recommend(target.level, runs, target.name, criteria=self.criteria, now=now,
                                                 level_since=target.level_since)
        if recommendation == "demote":
            self.store.start_level_hold(target.name, target.level.value, reason, now=now)
            if active is not None:
                return "still_held"
            log.warning("backend below its level's bar: held", extra={
                "backend": target.name, "level": target.level.value, "reason": reason, "non_blocking": target.blocks})
            return "held"
        if active is None:
            return "too_few_runs" if recommendation == "insufficient_data" else "meets_bar"
        if recommendation == "insufficient_data":
            return "still_held"
        hold = self.store.mark_level_hold_above_bar(target.name, now=now)
        if hold is not None and hold.above_since is not None and now - hold.above_since >= self.recovery:
            self.store.end_level_hold(target.name, RECOVERED, now=now)
            log.warning("backend back above its level's bar: hold ended", extra={"backend": target.name})
            return "recovered"
        return "above_bar"
