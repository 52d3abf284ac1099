"""The relay's parts: every service ``create_app`` runs, built once, in order, and kept as one typed record.

Triggered by :func:`relay.app.create_app` (``build_parts``); the app keeps the record
(``app.state.parts``) and its lifespan starts and stops the workers. Reads the settings and the
backend descriptors (the allowlist: callback tokens, levels, labels); writes nothing itself. The parts
talk through store rows (Prow style): intake writes outbox rows, the dispatcher claims them and creates
runs, callbacks and the sweeper change runs, and each only wakes the reporting worker, which finds what
to report by query; the re-run watcher writes outbox rows and wakes the dispatcher. The proposals pass
(only with ``RELAY_PROPOSALS_REPOSITORY``) reads runs and test results and writes pull requests on GitHub.

Only ``allowlist`` changes after start-up: a descriptor reload replaces it (intake's routing and the
dashboard read it per request) and hands it to the results side (``use_allowlist``). Routes read the
record through :func:`relay.web.app_parts.app_parts`, typed by what each reads; ``parts_of`` is the
whole record, for the command line, the dashboard and tests.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from conformance.descriptors import packaged_backends_dir

from relay.dispatch.dispatcher import Dispatcher
from relay.dispatch.reruns import RerunWatcher
from relay.github import DispatchSender, GitHubClient
from relay.levels.allowlist_reload import DescriptorReload
from relay.levels.proposals import Proposer
from relay.levels.review import criteria_from_settings
from relay.levels.watch import LevelWatch
from relay.metrics import Metrics
from relay.periodic import ReplicaLease
from relay.results.oidc import CallerAuth, JwksCache, OidcVerifier
from relay.results.receiver import CallbackService, RateLimiter, ReportLimits
from relay.results.reporter import CHECK_RUN, STATUS, Reporter, ReportingWorker
from relay.results.sweeper import Sweeper
from relay.settings import Settings
from relay.store import Store
from relay.trust import BackendTarget, load_allowlist
from relay.web.app_parts import app_parts
from relay.web.request_body import BodyBudget

__all__ = ["RelayParts", "ResultsSide", "build_parts", "parts_of"]

log = logging.getLogger("relay.assembly")


@dataclasses.dataclass
class ResultsSide:
    callbacks: CallbackService
    reporter: Reporter | None
    reporting: ReportingWorker | None
    sweeper: Sweeper | None
    reruns: RerunWatcher
    run_changed: Callable[..., None]  # (run_pk=None) a run row changed: reporting looks now
    level_watch: LevelWatch | None = None
    proposals: Proposer | None = None

    def start(self) -> None:
        for part in (self.reporting, self.sweeper, self.reruns, self.level_watch, self.proposals):
            if part is not None:
                part.start()

    def stop(self) -> None:
        for part in (self.proposals, self.level_watch, self.reruns, self.sweeper, self.reporting):
            if part is not None:
                part.stop()

    def rerun_requested(self) -> None:
        """Intake stored a re-run request: the re-run watcher looks now, not at its next poll."""
        self.reruns.wake()

    def problems(self) -> list[str]:
        """One sentence per background worker whose passes keep failing (``/readyz``)."""
        parts = (self.sweeper, self.reruns, self.level_watch, self.proposals)
        return [p for p in (part.problem() for part in parts if part is not None) if p]

    def use_allowlist(self, allowlist) -> None:
        """A descriptor reload: every part of the results side works from the new targets."""
        by_name = {t.name: t for t in allowlist}
        self.callbacks.auth.use(allowlist)
        if self.reporter is not None:
            self.reporter.targets = by_name
        self.reruns.backends = by_name
        for part in (self.level_watch, self.proposals):
            if part is not None:
                part.targets = tuple(allowlist)


@dataclasses.dataclass
class RelayParts:
    settings: Settings
    secrets: list[bytes]  # the webhook secrets, for signature checks
    body_budget: BodyBudget  # unauthenticated webhook bytes read at once
    allowlist: list[BackendTarget]  # replaced by a descriptor reload
    store: Store
    metrics: Metrics
    github: DispatchSender
    dispatcher: Dispatcher | None  # None: RELAY_DISPATCHER_ENABLED=false
    results: ResultsSide
    descriptors: DescriptorReload

    @property
    def callbacks(self) -> CallbackService:
        return self.results.callbacks


def build_parts(settings: Settings, *, github: DispatchSender | None = None) -> RelayParts:
    """Every part, each from the ones before it; ``github`` replaces the GitHub client (tests, embedding)."""
    backends_dir = settings.backends_dir or packaged_backends_dir()
    allowlist = load_allowlist(backends_dir)
    store = Store(settings.database_url, deadline_seconds=settings.store_deadline_seconds,
                  replay_window_seconds=settings.replay_window_hours * 3600)
    metrics = Metrics(store)
    github = github or GitHubClient.from_settings(settings)

    dispatcher = Dispatcher.from_settings(settings, store, github, metrics) if settings.dispatcher_enabled else None
    results = build_results_side(settings, allowlist=allowlist, store=store, github=github, metrics=metrics,
                                 dispatcher=dispatcher)

    def use_allowlist(targets) -> None:
        parts.allowlist = targets  # intake routing and the dashboard read it per request
        results.use_allowlist(targets)

    descriptors = DescriptorReload(backends_dir, store, use_allowlist, interval_seconds=settings.descriptor_check_seconds,
                                   on_level_changed=results.run_changed, active=allowlist)
    parts = RelayParts(
        settings=settings, secrets=settings.secret_values(),
        body_budget=BodyBudget(settings.unauthenticated_body_budget_bytes), allowlist=allowlist, store=store,
        metrics=metrics, github=github, dispatcher=dispatcher, results=results, descriptors=descriptors,
    )
    return parts


def _nothing_reports(_run_pk: int | None = None) -> None:
    """``run_changed`` with reporting off (RELAY_REPORTING_ENABLED=false): no one to wake."""


def build_results_side(settings, *, allowlist, store, github: Any, metrics, dispatcher=None) -> ResultsSide:
    """The callback receiver, reporting, sweeper, re-run watcher, level watch and proposals, tied through
    ``run_changed`` (a part that changes a run wakes reporting, which reads what changed from the store)."""
    verifier = None
    if settings.oidc_audience:
        jwks = JwksCache(settings.oidc_issuer, jwks_url=settings.oidc_jwks_url, timeout=settings.github_timeout_seconds)
        verifier = OidcVerifier(settings.oidc_issuer, settings.oidc_audience, jwks,
                                max_lifetime_seconds=settings.oidc_max_token_lifetime_seconds)
    else:
        log.warning("RELAY_OIDC_AUDIENCE is unset: OIDC callbacks are refused; only static callback tokens work")
    auth = CallerAuth(allowlist, verifier, identities=store)
    limiter = RateLimiter(settings.callback_rate_per_minute, settings.callback_rate_burst)
    limits = ReportLimits(max_tests=settings.callback_max_tests, max_message_chars=settings.callback_max_message_chars)
    callbacks = CallbackService(store=store, auth=auth, limiter=limiter, max_body_bytes=settings.callback_max_bytes,
                                report_limits=limits, max_attempts=settings.callback_max_attempts)
    reporter = reporting = None
    if settings.reporting_enabled:
        reporter = Reporter(store, github, {t.name: t for t in allowlist}, mode=CHECK_RUN if settings.uses_github_app else STATUS,
                            dashboard_url=settings.dashboard_url)
        reporting = ReportingWorker(reporter, poll_seconds=settings.reporting_poll_seconds,
                                    window_seconds=settings.nonce_ttl_hours * 3600)
    # Parts that change runs only wake reporting, which reads what changed from the store.
    run_changed = reporting.wake if reporting is not None else _nothing_reports

    callbacks.on_run_changed = run_changed
    sweeper = None
    if settings.sweeper_enabled:
        sweeper = Sweeper(
            store, start_timeout_seconds=settings.run_start_timeout_seconds,
            run_timeout_seconds=settings.run_timeout_seconds, nonce_ttl_seconds=settings.nonce_ttl_hours * 3600,
            interval_seconds=settings.sweep_interval_seconds, on_run_changed=run_changed,
            registry=metrics.registry,
        )
    reruns = RerunWatcher(
        store, {t.name: t for t in allowlist}, upstream=settings.upstream_repo, app_id=settings.github_app_id,
        poll_seconds=settings.rerun_poll_seconds, on_dispatched=dispatcher.wake if dispatcher is not None else None,
    )
    level_watch = None
    if settings.level_watch_enabled:
        level_watch = LevelWatch(store, allowlist, criteria=criteria_from_settings(settings),
                                 recovery_seconds=settings.level_hold_recovery_hours * 3600,
                                 interval_seconds=settings.level_watch_seconds,
                                 lease=ReplicaLease.for_interval(store, "level-watch", settings.level_watch_seconds))
    if dispatcher is not None:
        dispatcher.on_sent = run_changed
    proposals = None
    if settings.proposals_repository:
        proposals = Proposer.from_settings(
            settings, store, github, allowlist, registry=metrics.registry,
            lease=ReplicaLease.for_interval(store, "proposals", settings.proposals_interval_seconds))
    else:
        log.info("RELAY_PROPOSALS_REPOSITORY is unset: level changes and quarantine releases are not proposed")
    return ResultsSide(callbacks=callbacks, reporter=reporter, reporting=reporting, sweeper=sweeper, reruns=reruns,
                       run_changed=run_changed, level_watch=level_watch, proposals=proposals)


def parts_of(where) -> RelayParts:
    """The parts of the app serving ``where`` (a request, or the app itself)."""
    return app_parts(where)
