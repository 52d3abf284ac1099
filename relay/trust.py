"""Trust levels: the one table of what each level may do, and the backend targets it applies to.

Triggered at start-up and at each descriptor reload (``load_allowlist`` reads the backend descriptors'
``relay`` sections; ``relay.levels.allowlist_reload``) and
asked by every part that depends on a backend's level: intake (``route``: does it get the event?),
callback authentication (``BackendTarget.accepts_results``), reporting (``shows_on_pr``, ``blocks_under``:
a level hold suspends a blocking level's check, see :func:`suspends_blocking`),
the dashboard (``on_dashboard``) and the level review (``switches``, ``lower``, ``higher``). Writes
nothing. No other module compares levels: change a row of :data:`LEVELS` and every one of those
answers changes with it.

What a backend must show to hold a level, and to be promoted into it, is data too:
:data:`LEVEL_CRITERIA` (one :class:`LevelCriteria` per level, each criterion a measure, a bar and a
window). The defaults for L3 are the criteria ratified upstream: average queue under 30 min,
end-to-end p50 under 3 h and a time-out rate under 1 % over 7 days, under 1 % of runs over 3 h over
14 days, entered after at least 30 days at L2 with 14 days of data. ``relay.levels.review`` measures
runs against them.

The four switches and the L1-L4 presets follow PyTorch's RFC-0050 relay, so an allowlist written for
it reads the same here:

    level  forward_event  display_on_hud  display_on_pr  block_pr
    L1     yes            no              never          no     onboarding: events only
    L2     yes            yes             never          no     results on the dashboard
    L3     yes            yes             label_only     no     a check on PRs carrying the label
    L4     yes            yes             always         yes    a check on every PR, meant to be required

Results (callbacks) are accepted from a backend whose results show somewhere: on the dashboard or on
the PR. A check that does not block reports a failure as ``neutral``.

Routing (``route``): ``pull_request`` opened/reopened/synchronize/closed and ``push`` go to every target
with ``forward_event``; ``labeled``/``unlabeled`` go only to the target(s) whose label changed (so adding
``ciflow/crcr/<name>`` starts that backend's run now that its check will show); a push that deletes
its ref has no commit to test and goes nowhere; a repository that is not in the allowlist gets nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from conformance.descriptors import (
    BackendDescriptor, DescriptorError, QuarantinedTest, TrustLevel, load_descriptor,
)

__all__ = [
    "LEVELS",
    "LEVEL_CRITERIA",
    "Criterion",
    "HeldBelowBar",
    "LevelCriteria",
    "Measure",
    "PR_ACTIONS",
    "QuarantinedTest",
    "RoutedEvent",
    "RELEASE_AFTER_PASSES",
    "BackendTarget",
    "Comparison",
    "DisplayOnPR",
    "Switches",
    "TrustLevel",
    "criteria",
    "descriptor_paths",
    "higher",
    "load_allowlist",
    "lower",
    "lowest_accepting_results",
    "route",
    "suspends_blocking",
    "switches",
]


class RoutedEvent(Protocol):
    """What routing reads of an upstream event (intake's ``UpstreamEvent`` is one); trust names no flow."""

    event: str
    action: str | None
    changed_label: str | None
    head_ref: str | None
    deleted: bool

    @property
    def kind(self) -> str: ...


class DisplayOnPR(str, enum.Enum):
    always = "always"
    label_only = "label_only"
    never = "false"


@dataclasses.dataclass(frozen=True)
class Switches:
    forward_event: bool
    display_on_hud: bool
    display_on_pr: DisplayOnPR
    block_pr: bool

    @property
    def accepts_results(self) -> bool:
        """Results come back only where they show: on the dashboard or on the PR."""
        return self.display_on_hud or self.display_on_pr is not DisplayOnPR.never


LEVELS: dict[TrustLevel, Switches] = {
    TrustLevel.L1: Switches(forward_event=True, display_on_hud=False, display_on_pr=DisplayOnPR.never, block_pr=False),
    TrustLevel.L2: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.never, block_pr=False),
    TrustLevel.L3: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.label_only, block_pr=False),
    TrustLevel.L4: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.always, block_pr=True),
}

class Measure(str, enum.Enum):
    """What the level review measures over a criterion's window (cancelled and superseded runs never
    count; a run that tested another torch than the dispatched commit is not a success)."""

    runs = "runs"                                    # finished runs counted
    days_of_data = "days_of_data"                    # days from the oldest counted run to now
    days_at_level = "days_at_level"                  # days since the descriptor's relay.level_since
    success_rate = "success_rate"                    # successes / counted runs
    queue_mean_seconds = "queue_mean_seconds"        # dispatch -> start, mean
    queue_p90_seconds = "queue_p90_seconds"
    end_to_end_p50_seconds = "end_to_end_p50_seconds"  # dispatch -> finish
    end_to_end_p90_seconds = "end_to_end_p90_seconds"
    time_out_rate = "time_out_rate"                  # timed-out runs / counted runs
    over_time_limit_rate = "over_time_limit_rate"    # runs over the level's time limit (time-outs too) / counted


class Comparison(str, enum.Enum):
    above = "above"        # value > bar
    below = "below"        # value < bar
    at_least = "at_least"  # value >= bar


@dataclasses.dataclass(frozen=True)
class Criterion:
    measure: Measure
    comparison: Comparison
    bar: float
    window_days: int = 7

    def met(self, value: float | None) -> bool | None:
        """True/False against the bar; None when there is nothing to measure (no runs, no date)."""
        if value is None:
            return None
        if self.comparison is Comparison.above:
            return value > self.bar
        if self.comparison is Comparison.below:
            return value < self.bar
        return value >= self.bar


@dataclasses.dataclass(frozen=True)
class LevelCriteria:
    """``hold``: what a backend at this level must keep meeting (failing one recommends demotion,
    except a ``runs`` criterion, which means too little data to judge). ``entry``: what it must also
    show to be promoted into this level from the one below (time at that level, days of data)."""

    hold: tuple[Criterion, ...] = ()
    entry: tuple[Criterion, ...] = ()
    time_limit_seconds: float = 3 * 3600.0  # what ``over_time_limit_rate`` counts against

    @property
    def window_days(self) -> int:
        return max((c.window_days for c in (*self.hold, *self.entry)), default=7)


_MIN = 60.0
_HOUR = 3600.0
_SHOWN_ON_PR = (
    Criterion(Measure.runs, Comparison.at_least, 5),
    Criterion(Measure.success_rate, Comparison.above, 0.90),
    Criterion(Measure.queue_mean_seconds, Comparison.below, 30 * _MIN),
    Criterion(Measure.end_to_end_p50_seconds, Comparison.below, 3 * _HOUR),
    Criterion(Measure.time_out_rate, Comparison.below, 0.01),
    Criterion(Measure.over_time_limit_rate, Comparison.below, 0.01, window_days=14),
)
_ENTRY_AFTER_A_MONTH = (
    Criterion(Measure.days_at_level, Comparison.at_least, 30),
    Criterion(Measure.days_of_data, Comparison.at_least, 14, window_days=30),
)

LEVEL_CRITERIA: dict[TrustLevel, LevelCriteria] = {
    TrustLevel.L1: LevelCriteria(),  # sends no results back: nothing to measure
    TrustLevel.L2: LevelCriteria(hold=(
        Criterion(Measure.runs, Comparison.at_least, 5),
        Criterion(Measure.success_rate, Comparison.above, 0.70),
    )),
    TrustLevel.L3: LevelCriteria(hold=_SHOWN_ON_PR, entry=_ENTRY_AFTER_A_MONTH),
    TrustLevel.L4: LevelCriteria(hold=_SHOWN_ON_PR, entry=_ENTRY_AFTER_A_MONTH),
}


# A quarantined test whose newest this many counted results on a backend all passed is proposed for
# release (the test page says so; the proposals pass opens the pull request).
RELEASE_AFTER_PASSES = 10


def criteria(level: TrustLevel) -> LevelCriteria:
    """The criteria of ``level``, read at each question (like :func:`switches`)."""
    return LEVEL_CRITERIA[level]


# pull_request actions that start, restart or cancel downstream runs.
_FORWARDED_PR_ACTIONS = frozenset({"opened", "reopened", "synchronize", "closed"})
_LABEL_ACTIONS = frozenset({"labeled", "unlabeled"})
PR_ACTIONS = _FORWARDED_PR_ACTIONS | _LABEL_ACTIONS


def switches(level: TrustLevel) -> Switches:
    """The row of ``level``, read at each question (so a changed table changes every answer)."""
    return LEVELS[level]


def lower(level: TrustLevel) -> TrustLevel | None:
    """The next level down, or None for the lowest."""
    order = list(LEVELS)
    index = order.index(level)
    return order[index - 1] if index > 0 else None


def higher(level: TrustLevel) -> TrustLevel | None:
    """The next level up, or None for the highest."""
    order = list(LEVELS)
    index = order.index(level)
    return order[index + 1] if index + 1 < len(order) else None


def lowest_accepting_results() -> TrustLevel | None:
    """The lowest level whose callbacks are accepted (for messages that say what to promote to)."""
    return next((level for level, row in LEVELS.items() if row.accepts_results), None)


class HeldBelowBar(Protocol):
    """What the trust module reads of a level hold (``relay.store.LevelHold``)."""

    level: str
    reason: str
    started_at: dt.datetime

    @property
    def active(self) -> bool: ...


def suspends_blocking(target: "BackendTarget", hold: HeldBelowBar | None) -> bool:
    """A hold makes a blocking level's check non-blocking while it is active and is of the backend's
    current level (a level change ends it; an old hold of another level suspends nothing)."""
    return hold is not None and hold.active and hold.level == target.level.value and target.switches.block_pr


@dataclasses.dataclass(frozen=True)
class BackendTarget:
    """One allowlisted downstream repository (a backend descriptor with a ``relay`` section), and every
    question the relay asks about what its level allows."""

    name: str
    repository: str
    level: TrustLevel
    label: str
    level_since: dt.date | None = None
    quarantine: tuple[QuarantinedTest, ...] = ()
    callback_token_sha256: str | None = dataclasses.field(default=None, repr=False, compare=False)
    # The repository's numeric identity for OIDC callbacks (None: pinned at the first callback), and
    # the workflow its callbacks must come from (None: any).
    repository_id: int | None = None
    repository_owner_id: int | None = None
    workflow_ref: str | None = None

    @property
    def switches(self) -> Switches:
        return switches(self.level)

    @property
    def forwards(self) -> bool:
        """Upstream events are dispatched to this backend."""
        return self.switches.forward_event

    @property
    def on_dashboard(self) -> bool:
        """Its runs are shown on the dashboard."""
        return self.switches.display_on_hud

    @property
    def accepts_results(self) -> bool:
        """Its callbacks are accepted (see :attr:`Switches.accepts_results`)."""
        return self.switches.accepts_results

    @property
    def blocks(self) -> bool:
        """Its level's check may fail the PR; a non-blocking check reports failures as ``neutral``."""
        return self.switches.block_pr

    def blocks_under(self, hold: "HeldBelowBar | None") -> bool:
        """Whether its check may fail the PR now: its level blocks, and no active hold of that level
        (the backend found below the level's hold bar, ``relay.levels.watch``) suspends it."""
        return self.blocks and not suspends_blocking(self, hold)

    def shows_on_pr(self, pr_labels: Sequence[str] | None) -> bool:
        """Whether its results appear upstream, given the PR's current labels (None: a push, no PR)."""
        mode = self.switches.display_on_pr
        if mode is DisplayOnPR.always:
            return True
        return mode is DisplayOnPR.label_only and pr_labels is not None and self.label in pr_labels

    def quarantined(self, test_id: str, day: dt.date) -> QuarantinedTest | None:
        """The quarantine entry that makes ``test_id``'s failures non-blocking on ``day``, if any."""
        return next((q for q in self.quarantine if q.applies_on(day) and q.matches(test_id)), None)

    @classmethod
    def from_descriptor(cls, descriptor: BackendDescriptor) -> "BackendTarget":
        assert descriptor.relay is not None and descriptor.relay_label is not None
        return cls(
            name=descriptor.name, repository=descriptor.relay.repository, level=descriptor.relay.level,
            label=descriptor.relay_label, level_since=descriptor.relay.level_since,
            quarantine=descriptor.relay.quarantine,
            callback_token_sha256=descriptor.relay.callback_token_sha256,
            repository_id=descriptor.relay.repository_id, repository_owner_id=descriptor.relay.repository_owner_id,
            workflow_ref=descriptor.relay.workflow_ref,
        )


def descriptor_paths(backends_dir: Path) -> list[Path]:
    """The ``*.yaml`` files of ``backends_dir``; raises DescriptorError for one that is a symlink to a
    file outside the folder (its lines would be read, and echoed in errors, as a descriptor's)."""
    if not backends_dir.is_dir():
        raise DescriptorError(f"RELAY_BACKENDS_DIR: {backends_dir} is not a directory of backend *.yaml files")
    folder = backends_dir.resolve()
    paths = sorted(backends_dir.glob("*.yaml"))
    for path in paths:
        if path.is_symlink() and not path.resolve().is_relative_to(folder):
            raise DescriptorError(
                f"{path}: a symlink to a file outside {backends_dir}; refused -> put the descriptor itself in the folder"
            )
    return paths


def load_allowlist(backends_dir: Path, *, active: Iterable[str] = ()) -> tuple[BackendTarget, ...]:
    """load_allowlist(dir, active=()) -> the targets of every ``*.yaml`` in ``dir`` that has a ``relay`` section.

    Raises DescriptorError (naming the file and field) for an invalid descriptor, a symlink out of
    ``dir``, when two backends name the same downstream repository or label, or when a backend of
    ``active`` (the allowlist in use) would leave without its descriptor saying why (``relay_retired``):
    a file removed or cut before its relay section is taken for one being written, not a decision.
    """
    descriptors = [load_descriptor(p) for p in descriptor_paths(backends_dir)]
    targets = [BackendTarget.from_descriptor(d) for d in descriptors if d.relay is not None]
    staying = {t.name for t in targets}
    retired = {d.name for d in descriptors if d.relay is None and d.relay_retired}
    for name in sorted(set(active) - staying - retired):
        path = backends_dir / f"{name}.yaml"
        why = "has no relay section" if path.exists() else "is missing"
        raise DescriptorError(
            f"{path}: backend {name!r} is in the allowlist but its descriptor {why} (a file being written?); "
            f"the allowlist in use is kept -> to take it out, write relay_retired: <why> in place of its relay section"
        )
    for attribute in ("repository", "label"):
        seen: dict[str, str] = {}
        for target in targets:
            value = getattr(target, attribute).lower()
            if value in seen:
                raise DescriptorError(
                    f"{backends_dir}: backends {seen[value]!r} and {target.name!r} both use relay "
                    f"{attribute} {getattr(target, attribute)!r}; each backend needs its own"
                )
            seen[value] = target.name
    return tuple(targets)


def route(event: RoutedEvent, targets: Iterable[BackendTarget]) -> tuple[list[BackendTarget], str | None]:
    """route(event, targets) -> (targets to dispatch to, reason when there are none)."""
    forwarding = [t for t in targets if t.forwards]
    if event.event == "push" and event.deleted:
        return [], f"push deleted {event.head_ref}; there is no commit to test"
    if event.event == "push":
        chosen = forwarding
    elif event.event == "pull_request" and event.action in _FORWARDED_PR_ACTIONS:
        chosen = forwarding
    elif event.event == "pull_request" and event.action in _LABEL_ACTIONS:
        chosen = [t for t in forwarding if t.label == event.changed_label]
        if not chosen:
            return [], f"label {event.changed_label!r} belongs to no allowlisted backend"
    else:
        return [], f"{event.kind} is not forwarded"
    if not chosen:
        return [], "no backend in the allowlist forwards events"
    return chosen, None
