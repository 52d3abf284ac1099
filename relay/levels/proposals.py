"""Proposals: level changes and quarantine releases as pull requests on the descriptor repository.

Triggered every ``RELAY_PROPOSALS_INTERVAL_SECONDS`` by its own thread (started with the app when
``RELAY_PROPOSALS_REPOSITORY`` is set), or once by ``relay levels propose`` (:mod:`relay.levels.command_line`). Reads the level review
(:func:`relay.levels.review.recommend` over the store's runs), the quarantine entries of the loaded
descriptors and their tests' newest results, and the level holds; writes only to GitHub, through
:mod:`relay.github` (branch, file update, pull request). Nothing happens without a repository.

What is proposed:

* a **promotion** as soon as the review recommends one (it already requires the entry criteria, such
  as a month at the level below);
* a **demotion** once the review recommends it and the backend's level hold (written by the level
  watch, :mod:`relay.store.level_holds`) has had it below its bar, without a break, for
  ``RELAY_PROPOSALS_DEMOTE_AFTER_SECONDS``;
* the **release** of a quarantine entry once every test it matches that ran in the last
  ``RELEASE_WINDOW_DAYS`` has passed its newest :data:`relay.trust.RELEASE_AFTER_PASSES` results;
* a **torch bound** for a known failure (``torch: "<V"``, joined to the bound it has) once a run of a
  push to upstream's main branch, on the dispatched commit's torch V, passed tests that the entry says
  fail (its unexpected passes, :mod:`relay.results.fixed_entries`): torch fixed it in V.

One subject (a backend's level, one quarantine entry or one known failure of a backend) has one
deterministic branch (``relay/level/<backend>``, ``relay/quarantine-release/<backend>/<digest of the
match>``, ``relay/known-failure-bound/<backend>/<digest of the match>``) and at most one
open pull request: a later pass updates that branch's file and the pull request's title and body, so
the state lives in GitHub and survives restarts. When the reason goes away (the review no longer
recommends it, the tests fail again), the relay closes its pull request and says why in the body.
A pull request a person closed without merging declines that exact change (the marker in its body
names it): it is not proposed again until the change differs (another level, a new ``level_since``,
another expiry). A merged one shows on the base branch, and then there is nothing left to propose.

The edited file is the base branch's descriptor with only the level lines (``level``, ``level_since``)
changed or one quarantine entry removed (:mod:`relay.levels.descriptor_text`). A pass writes for at most
``RELAY_PROPOSALS_MAX_PER_PASS`` subjects; the next pass starts where it stopped. A subject whose
descriptor or GitHub call fails is logged and counted, and the others go on; a rate limit ends the pass.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from prometheus_client import CollectorRegistry, Counter

from packaging.version import InvalidVersion, Version

from relay import trust
from relay.levels.descriptor_text import (
    DescriptorEditError, bound_known_failure_before, remove_quarantine_entry, set_level,
)
from relay.github import CallResult, GitHubCallError, PermanentError, RateLimitedError, RepositoryFile
from relay.levels.review import CriterionResult, recommend
from relay.periodic import PeriodicThread, ReplicaLease, RunsPeriodically
from relay.results import fixed_entries
from relay.results.fixed_entries import FixedEntry
from relay.results.summary import md_code
from relay.store.base import utcnow
from relay.store.level_holds import LevelHold
from relay.trust import BackendTarget, QuarantinedTest

__all__ = [
    "ACTIONS", "ProposalClient", "ProposalOutcome", "Proposer", "RELEASE_WINDOW_DAYS",
    "UPSTREAM_MAIN_REF", "bound_branch", "level_branch", "release_branch",
]

log = logging.getLogger("relay.proposals")

ACTIONS = ("opened", "updated", "unchanged", "closed", "declined", "applied", "none", "failed")
RELEASE_WINDOW_DAYS = 30  # tests of a quarantine entry that ran this recently must all pass
EVIDENCE_ROWS = 20  # tests listed in a release's body (GitHub takes at most 65 536 characters)
MARK = "<!-- relay-proposal: {key} -->"
# Pushes here are upstream's main branch: a known failure passing there is fixed in torch itself.
UPSTREAM_MAIN_REF = "refs/heads/main"
CLOSED_MARK = "<!-- relay-proposal-closed -->"


class ProposalClient(Protocol):
    """The GitHub calls proposals make (:class:`relay.github.GitHubClient` has them)."""

    def file_at(self, repository: str, path: str, ref: str) -> RepositoryFile | None: ...

    def branch_head(self, repository: str, branch: str) -> str | None: ...

    def create_branch(self, repository: str, branch: str, sha: str) -> CallResult: ...

    def move_branch(self, repository: str, branch: str, sha: str, *, force: bool = False) -> CallResult: ...

    def put_file(self, repository: str, path: str, *, content: bytes, message: str, branch: str,
                 sha: str | None) -> CallResult: ...

    def pull_requests_from(self, repository: str, branch: str, *, base: str, limit: int = 5) -> list[dict[str, Any]]: ...

    def create_pull_request(self, repository: str, *, title: str, head: str, base: str, body: str) -> CallResult: ...

    def update_pull_request(self, repository: str, number: int, **fields: Any) -> CallResult: ...


def level_branch(backend: str) -> str:
    return f"relay/level/{backend}"


def release_branch(backend: str, match: str) -> str:
    return f"relay/quarantine-release/{backend}/{hashlib.sha256(match.encode()).hexdigest()[:12]}"


def bound_branch(backend: str, match: str) -> str:
    return f"relay/known-failure-bound/{backend}/{hashlib.sha256(match.encode()).hexdigest()[:12]}"


@dataclasses.dataclass(frozen=True)
class Proposal:
    """The change wanted on one subject's branch, and how it is explained."""

    key: str  # names the change; a person's "no" (closing the pull request) holds until it differs
    title: str
    body: str
    commit_message: str
    edit: Callable[[str], str] = dataclasses.field(compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Subject:
    """One thing that has at most one open proposal: a backend's level, or one of its quarantine entries."""

    kind: str  # level | release | bound
    backend: str
    branch: str
    path: str
    wanted: Proposal | None
    why_not: str  # when nothing is wanted: said in the body of a pull request the relay closes


@dataclasses.dataclass(frozen=True)
class ProposalOutcome:
    kind: str
    backend: str
    branch: str
    action: str  # one of ACTIONS
    pull_request: int | None = None
    url: str | None = None
    detail: str = ""


# --- what to propose ---------------------------------------------------------------------------
def _criteria_table(results: Sequence[CriterionResult]) -> list[str]:
    lines = ["| criterion | needed | value | bar | met |", "|---|---|---|---|---|"]
    for c in results:
        scope = f"to enter {c.level}" if c.entry else f"to hold {c.level}"
        met = {True: "yes", False: "**no**", None: "no data"}[c.met]
        lines.append(f"| {c.label} | {scope} | {c.value_text} | {c.bar_text} | {met} |")
    return lines


def _footer(dashboard_url: str, backend: str) -> list[str]:
    return [
        "", f"Backend page: {dashboard_url}/backends/{quote(backend)}", "",
        "Merging applies the change once the relay reloads its descriptors. Closing this pull request "
        "without merging declines it: the relay does not propose the same change again.",
    ]


def _span_text(span: dt.timedelta) -> str:
    seconds = span.total_seconds()
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:g} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:g} hours"
    return f"{seconds / 60:g} minutes"


def _level_proposal(target: BackendTarget, path: str, rec: str, new_level: str, reason: str,
                    results: Sequence[CriterionResult], *, today: dt.date, hold: LevelHold | None,
                    span: dt.timedelta, dashboard_url: str) -> Proposal:
    old = target.level.value
    verb = "promote" if rec == "promote" else "demote"
    key = f"level {target.name} {old}->{new_level} level_since={target.level_since}"
    if hold is None:
        why = f"it meets every {new_level} criterion"
    else:
        key += f" hold={hold.id}"
        why = (f"it has been below its {old} bar since {hold.started_at:%Y-%m-%d %H:%M} UTC, as its level hold "
               f"records (a demotion is proposed after {_span_text(span)} below)")
    body = [
        MARK.format(key=key),
        f"The relay proposes to {verb} **{target.name}** from **{old}** to **{new_level}**: {why}.", "",
        f"Review: {reason}.", "", *_criteria_table(results), "",
        f"This changes `relay.level` to `{new_level}` and `relay.level_since` to `{today.isoformat()}` in "
        f"`{path}`; nothing else in the file changes.",
        *_footer(dashboard_url, target.name),
    ]
    return Proposal(
        key=key,
        title=f"{target.name}: {verb} from {old} to {new_level}",
        body="\n".join(body),
        commit_message=f"{target.name}: {verb} from {old} to {new_level} (relay level review)\n\n{reason}",
        edit=lambda text: set_level(text, new_level, today, where=path),
    )


def _release_proposal(target: BackendTarget, entry: QuarantinedTest, path: str, evidence: Mapping[str, list],
                      *, dashboard_url: str) -> Proposal:
    needed = trust.RELEASE_AFTER_PASSES
    lines = [
        MARK.format(key=f"release {target.name} {entry.match} expires={entry.expires}"),
        f"The relay proposes to release {md_code(entry.match)} from **{target.name}**'s quarantine: every test "
        f"it matches that ran in the last {RELEASE_WINDOW_DAYS} days passed its newest {needed} results.", "",
        f"Quarantined until {entry.expires.isoformat()} because: {md_code(entry.reason)}", "",
        "| test | newest results | runs |", "|---|---|---|",
    ]
    for test_id, results in list(evidence.items())[:EVIDENCE_ROWS]:
        runs = ", ".join(f"[{r.run_pk}]({dashboard_url}/runs/{r.run_pk})" for r in results)
        lines.append(f"| [{md_code(test_id, in_table=True)}]({dashboard_url}/tests/{quote(test_id, safe='')}) "
                     f"| {len(results)} passed | {runs} |")
    if len(evidence) > EVIDENCE_ROWS:
        lines.append(f"| and {len(evidence) - EVIDENCE_ROWS} more tests, each {needed} passed | | |")
    lines += ["", f"This removes that entry from `relay.quarantine` in `{path}`; nothing else in the file changes.",
              *_footer(dashboard_url, target.name)]
    return Proposal(
        key=f"release {target.name} {entry.match} expires={entry.expires}",
        title=f"{target.name}: release {entry.match[:150]} from quarantine",
        body="\n".join(lines),
        commit_message=f"{target.name}: release {entry.match} from quarantine ({needed} passes in a row)",
        edit=lambda text: remove_quarantine_entry(text, entry.match, where=path),
    )


def _bound_proposal(target: BackendTarget, entry: FixedEntry, fixed_in: str, runs: Sequence, path: str, *,
                    dashboard_url: str) -> Proposal:
    key = f"bound {target.name} {entry.match} <{fixed_in}"
    lines = [
        MARK.format(key=key),
        f"The relay proposes to bound the known failure {md_code(entry.match)} of **{target.name}** to torch "
        f"before {md_code(fixed_in)}: on pushes to upstream's main branch, on that torch, tests it covers pass.", "",
        f"The entry: {md_code(entry.reason)} ({md_code(entry.link)})"
        + (f", bounded today to {md_code(entry.torch)}" if entry.torch else "") + ".", "",
        "| run | torch | tests that passed |", "|---|---|---|",
    ]
    for run, tests in runs[:EVIDENCE_ROWS]:
        lines.append(f"| [{run.id}]({dashboard_url}/runs/{run.id}) | {md_code(run.torch_version, in_table=True)} | "
                     f"{', '.join(md_code(t, in_table=True) for t in tests[:5])}{' ...' if len(tests) > 5 else ''} |")
    lines += ["", f"This adds `<{fixed_in}` to that entry's `torch` bound in `{path}`; nothing else in the file "
              "changes. Older torches still get the entry; this one and later ones run the tests for real.",
              *_footer(dashboard_url, target.name)]
    return Proposal(
        key=key,
        title=f"{target.name}: known failure {entry.match[:120]} is fixed in torch {fixed_in}",
        body="\n".join(lines),
        commit_message=f"{target.name}: bound {entry.match} to torch <{fixed_in} (passes on upstream main)",
        edit=lambda text: bound_known_failure_before(text, entry.match, fixed_in, where=path),
    )


# --- the pass ------------------------------------------------------------------------------------
class Proposer(RunsPeriodically):
    """Proposer(store, github, targets, repository=..., criteria=...): one pass with ``propose_once()``."""

    def __init__(self, store, github: ProposalClient, targets: Sequence[BackendTarget], *, repository: str,
                 criteria, base: str = "main", path_pattern: str = "backends/{name}.yaml",
                 paths: Mapping[str, str] | None = None, demote_after_seconds: float = 3 * 86400.0,
                 dashboard_url: str = "http://127.0.0.1:8000", max_per_pass: int = 20,
                 interval_seconds: float = 3600.0, registry: CollectorRegistry | None = None,
                 clock: Callable[[], dt.datetime] = utcnow, lease: ReplicaLease | None = None):
        self.store = store
        self.github = github
        self.targets = tuple(targets)
        self.repository = repository
        self.criteria = criteria
        self.base = base
        self.path_pattern = path_pattern
        self.paths = dict(paths or {})
        self.demote_after = dt.timedelta(seconds=demote_after_seconds)
        self.dashboard_url = dashboard_url.rstrip("/")
        self.max_per_pass = max_per_pass
        self.clock = clock
        self.totals: collections.Counter[str] = collections.Counter()
        self._counter = Counter("relay_proposals", "proposal pass results, by kind and action", ["kind", "action"],
                                registry=registry if registry is not None else CollectorRegistry())
        self._next = 0  # where the next pass starts, so a bounded pass never starves the later subjects
        self._periodic = PeriodicThread("relay-proposals", interval_seconds, self.propose_once, lease=lease)

    @classmethod
    def from_settings(cls, settings, store, github: ProposalClient, targets, *, registry=None,
                      lease: ReplicaLease | None = None) -> "Proposer":
        from relay.levels.review import criteria_from_settings

        return cls(store, github, targets, repository=settings.proposals_repository,
                   criteria=criteria_from_settings(settings), base=settings.proposals_base_branch,
                   path_pattern=settings.proposals_descriptor_path, paths=settings.proposals_descriptor_paths,
                   demote_after_seconds=settings.proposals_demote_after_seconds, dashboard_url=settings.dashboard_url,
                   max_per_pass=settings.proposals_max_per_pass, interval_seconds=settings.proposals_interval_seconds,
                   registry=registry, lease=lease)

    def path_of(self, backend: str) -> str:
        return self.paths.get(backend) or self.path_pattern.replace("{name}", backend)

    # --- planning
    def subjects(self, now: dt.datetime) -> list[Subject]:
        """Every subject (each backend's level, each quarantine entry in force) with what it wants now."""
        window = max(lc.window_days for lc in self.criteria.values())
        runs = self.store.runs(since=now - dt.timedelta(days=window), until=now)
        out = []
        for target in self.targets:
            out.append(self._level_subject(target, runs, now))
            out.extend(self._release_subject(target, entry, now)
                       for entry in target.quarantine if entry.applies_on(now.date()))
            out.extend(self._bound_subjects(target, runs))
        return out

    def _bound_subjects(self, target: BackendTarget, runs) -> list[Subject]:
        """One subject per known failure that completed runs of pushes to upstream's main, on the
        dispatched commit's torch, found fixed; bounded before the oldest torch that passed."""
        mains = {r.id: r for r in runs if r.backend == target.name and r.event == "push"
                 and r.head_ref == UPSTREAM_MAIN_REF and r.state == "completed" and r.provenance == "matched"
                 and r.torch_version}
        if not mains:
            return []
        evidence: dict[str, tuple[FixedEntry, list]] = {}
        for run in sorted(mains.values(), key=lambda r: r.id):
            for entry in fixed_entries.of_run(run):
                evidence.setdefault(entry.match, (entry, []))[1].append((run, list(entry.tests)))
        path = self.path_of(target.name)
        subjects = []
        for match, (entry, seen) in evidence.items():
            try:
                fixed_in = min((Version(Version(run.torch_version).public) for run, _ in seen))
            except InvalidVersion:
                continue  # a torch version the bound could not be written for
            wanted = _bound_proposal(target, entry, str(fixed_in), seen, path, dashboard_url=self.dashboard_url)
            subjects.append(Subject("bound", target.name, bound_branch(target.name, match), path, wanted,
                                    "no push to upstream's main shows it fixed any more"))
        return subjects

    def _level_subject(self, target: BackendTarget, runs, now: dt.datetime) -> Subject:
        path = self.path_of(target.name)
        rec, new_level, reason, results = recommend(target.level, runs, target.name, criteria=self.criteria, now=now,
                                                    level_since=target.level_since)
        wanted, why_not = None, f"the level review now says {rec}: {reason}"
        hold = None
        if rec == "demote":
            # "Below its bar since when" is the level watch's hold (relay.store.level_holds), not a second record.
            found = self.store.current_level_hold(target.name)
            if found is not None and found.above_since is None and found.level == target.level.value:
                hold = found
        if rec == "promote" or (hold is not None and now - hold.started_at >= self.demote_after):
            wanted = _level_proposal(target, path, rec, new_level, reason, results, today=now.date(), hold=hold,
                                     span=self.demote_after, dashboard_url=self.dashboard_url)
        elif rec == "demote":
            why_not = (f"it has been below its bar for less than {_span_text(self.demote_after)}" if hold is not None else
                       "no active level hold has it below its bar (it is back above, or a person restored it)")
        return Subject("level", target.name, level_branch(target.name), path, wanted, why_not)

    def _release_subject(self, target: BackendTarget, entry: QuarantinedTest, now: dt.datetime) -> Subject:
        path = self.path_of(target.name)
        needed = trust.RELEASE_AFTER_PASSES
        found = self.store.newest_results_matching(target.name, entry.match, since=now - dt.timedelta(days=RELEASE_WINDOW_DAYS),
                                                   per_test=needed)
        evidence = {test_id: results for test_id, results in found.items() if entry.matches(test_id)}
        short = [t for t, results in evidence.items()
                 if len(results) < needed or any(r.outcome != "passed" for r in results)]
        wanted = None
        if evidence and not short:
            wanted = _release_proposal(target, entry, path, evidence, dashboard_url=self.dashboard_url)
        why_not = (f"no test it matches ran in the last {RELEASE_WINDOW_DAYS} days" if not evidence else
                   f"{len(short)} test(s) it matches have not passed their newest {needed} results")
        return Subject("release", target.name, release_branch(target.name, entry.match), path, wanted, why_not)

    # --- applying
    def propose_once(self) -> list[ProposalOutcome]:
        """One pass; returns what happened to each subject looked at."""
        now = self.clock()
        subjects = self.subjects(now)
        if not subjects:
            return []
        start = self._next % len(subjects)
        outcomes: list[ProposalOutcome] = []
        writes = 0
        for offset in range(len(subjects)):
            subject = subjects[(start + offset) % len(subjects)]
            if writes >= self.max_per_pass:
                self._next = (start + offset) % len(subjects)
                break
            try:
                outcome = self._apply(subject)
            except RateLimitedError as exc:
                log.warning("proposals: GitHub rate limit; the pass stops here",
                            extra={"backend": subject.backend, "wait_seconds": exc.wait_seconds})
                outcomes.append(ProposalOutcome(subject.kind, subject.backend, subject.branch, "failed", detail=str(exc)))
                self._next = (start + offset) % len(subjects)
                break
            except (GitHubCallError, DescriptorEditError) as exc:
                log.error("proposals: %s", exc, extra={"backend": subject.backend, "branch": subject.branch})
                outcome = ProposalOutcome(subject.kind, subject.backend, subject.branch, "failed", detail=str(exc))
            except Exception as exc:  # noqa: BLE001 - an unexpected answer fails this subject, not its neighbours
                log.exception("proposals: subject failed", extra={"backend": subject.backend, "branch": subject.branch})
                outcome = ProposalOutcome(subject.kind, subject.backend, subject.branch, "failed",
                                          detail=f"{type(exc).__name__}: {exc}")
            outcomes.append(outcome)
            if outcome.action in ("opened", "updated", "closed"):
                writes += 1
        else:
            self._next = start
        for outcome in outcomes:
            self._counter.labels(kind=outcome.kind, action=outcome.action).inc()
            self.totals[outcome.action] += 1
            if outcome.action not in ("none", "unchanged"):
                log.info("proposal %s", outcome.action, extra={"backend": outcome.backend, "branch": outcome.branch,
                                                               "pull_request": outcome.pull_request})
        return outcomes

    def _outcome(self, subject: Subject, action: str, pr: dict[str, Any] | None = None, detail: str = "") -> ProposalOutcome:
        return ProposalOutcome(subject.kind, subject.backend, subject.branch, action,
                               pr.get("number") if pr else None, pr.get("html_url") if pr else None, detail)

    def _apply(self, subject: Subject) -> ProposalOutcome:
        repo, base = self.repository, self.base
        pulls = self.github.pull_requests_from(repo, subject.branch, base=base)
        open_pr = next((p for p in pulls if p.get("state") == "open"), None)
        wanted = subject.wanted
        if wanted is None:
            if open_pr is None:
                return self._outcome(subject, "none")
            return self._close(subject, open_pr, f"The relay closed this proposal: {subject.why_not}.")
        base_file = self.github.file_at(repo, subject.path, base)
        if base_file is None:
            raise PermanentError(f"{subject.path} is not on {base} of {repo}: set RELAY_PROPOSALS_DESCRIPTOR_PATH "
                                 f"(or RELAY_PROPOSALS_DESCRIPTOR_PATHS for {subject.backend}) to where it is")
        original = base_file.content.decode()
        proposed = wanted.edit(original)
        if proposed == original:  # merged, or made by hand
            if open_pr is not None:
                return self._close(subject, open_pr, f"The relay closed this proposal: {base} already has the change.")
            return self._outcome(subject, "applied")
        mark = MARK.format(key=wanted.key)
        if open_pr is None:
            latest = pulls[0] if pulls else None
            if (latest is not None and not latest.get("merged_at") and mark in (latest.get("body") or "")
                    and CLOSED_MARK not in (latest.get("body") or "")):
                return self._outcome(subject, "declined", latest, "closed without merging by a person")
            return self._open(subject, wanted, base_file, proposed)
        changed = False
        branch_file = self.github.file_at(repo, subject.path, subject.branch)
        if branch_file is None or branch_file.content.decode() != proposed:
            self.github.put_file(repo, subject.path, content=proposed.encode(), message=wanted.commit_message,
                                 branch=subject.branch, sha=branch_file.sha if branch_file else None)
            changed = True
        if open_pr.get("title") != wanted.title or (open_pr.get("body") or "") != wanted.body:
            self.github.update_pull_request(repo, open_pr["number"], title=wanted.title, body=wanted.body)
            changed = True
        return self._outcome(subject, "updated" if changed else "unchanged", open_pr)

    def _open(self, subject: Subject, wanted: Proposal, base_file: RepositoryFile, proposed: str) -> ProposalOutcome:
        repo, base = self.repository, self.base
        head = self.github.branch_head(repo, base)
        if head is None:
            raise PermanentError(f"branch {base} is not in {repo}: set RELAY_PROPOSALS_BASE_BRANCH")
        # The branch is the relay's: a leftover one (an earlier, closed proposal) starts again from the base.
        if self.github.branch_head(repo, subject.branch) is None:
            self.github.create_branch(repo, subject.branch, head)
        else:
            self.github.move_branch(repo, subject.branch, head, force=True)
        self.github.put_file(repo, subject.path, content=proposed.encode(), message=wanted.commit_message,
                             branch=subject.branch, sha=base_file.sha)
        created = self.github.create_pull_request(repo, title=wanted.title, head=subject.branch, base=base,
                                                  body=wanted.body)
        return self._outcome(subject, "opened", created.data)

    def _close(self, subject: Subject, pr: dict[str, Any], why: str) -> ProposalOutcome:
        body = f"{CLOSED_MARK}\n**{why}**\n\n{pr.get('body') or ''}"
        self.github.update_pull_request(self.repository, pr["number"], body=body, state="closed")
        return self._outcome(subject, "closed", pr, why)
