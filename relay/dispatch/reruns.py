"""Re-runs: upstream asks for a backend's run again, and the relay dispatches it again.

Triggered by intake as it stores a request, and by the re-run watcher's poll (every
``RELAY_RERUN_POLL_SECONDS``, for requests another replica stored) over the webhooks intake stored for the
results side: ``check_run.rerequested`` (the "Re-run" button on one of our check runs),
``check_suite.rerequested`` ("Re-run all checks": every backend with a check run on that commit), and a PR
comment ``/retest`` or ``/retest <backend>`` whose author's association is OWNER, MEMBER or
COLLABORATOR. A check run is ours only when all of these hold: it comes from the relay's GitHub App,
its name is ``crcr/<backend>``, its ``external_id`` names a run of that backend on the same head sha,
and its id is the check run the relay recorded creating for that run (a relay writing commit
statuses owns no check run). A check suite must come from the relay's App; a ``/retest`` comment
must name its PR (``issue.number``). Anyone else's comment, or a request for something that is not ours, is ignored with a
log line saying why. Reads the stored webhook and the runs it names; writes, in one transaction, a
record of what the request did and the new outbox rows (same event, same commit, a fresh nonce), which
the dispatcher then sends like any other.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from relay.periodic import PeriodicThread, RunsPeriodically
from relay.store import NewDispatch, StoreUnavailable
from relay.store.deliveries import DeliveryView
from relay.store.rerun_requests import RERUNS
from relay.store.runs import RunView
from relay.trust import BackendTarget

__all__ = ["RETEST_ASSOCIATIONS", "RerunDecision", "RerunWatcher", "decide_rerun", "parse_retest"]

log = logging.getLogger("relay.rerun")

RETEST_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
CHECK_PREFIX = "crcr/"
_RETEST = re.compile(r"^/retest(?:[ \t]+(?P<backend>[A-Za-z0-9_-]+))?[ \t]*$")


@dataclasses.dataclass(frozen=True)
class RerunDecision:
    """Which runs to dispatch again (their backends), or why nothing."""

    runs: tuple[RunView, ...] = ()
    reason: str | None = None


def parse_retest(body: str) -> tuple[bool, str | None]:
    """parse_retest(comment body) -> (is a /retest command, backend or None for all). First line only."""
    first = (body or "").strip().splitlines()[0] if (body or "").strip() else ""
    match = _RETEST.match(first.strip())
    return (False, None) if match is None else (True, match.group("backend"))


def _latest_per_backend(runs: Iterable[RunView]) -> list[RunView]:
    latest: dict[str, RunView] = {}
    for run in runs:  # newest first
        latest.setdefault(run.backend, run)
    return sorted(latest.values(), key=lambda r: r.backend)


def _app_refusal(what: str, section: dict[str, Any], app_id: str | None) -> str | None:
    """Why a check_run/check_suite event is not ours by its App, or None when it is."""
    if app_id is None:
        return f"the relay reports commit statuses (no GitHub App), so no {what} is its own"
    app = (section.get("app") or {}).get("id")
    if str(app) != str(app_id):
        return f"the {what} belongs to app {app}, not to the relay's app {app_id}"
    return None


def _check_run_decision(check: dict[str, Any], store, app_id: str | None) -> RerunDecision:
    """Re-run one check run, only if the relay created it: our App, our name, our run, same backend and head."""
    name = str(check.get("name") or "")
    if not name.startswith(CHECK_PREFIX):
        return RerunDecision(reason=f"check run {name!r} is not one of the relay's (crcr/<backend>)")
    refusal = _app_refusal("check run", check, app_id)
    if refusal:
        return RerunDecision(reason=refusal)
    external = str(check.get("external_id") or "")
    if not external.isdigit():
        return RerunDecision(reason=f"check run {name!r} has no external_id naming a relay run")
    run = store.run(int(external))
    if run is None:
        return RerunDecision(reason=f"external_id {external} of {name!r} names no run the relay knows")
    if f"{CHECK_PREFIX}{run.backend}" != name:
        return RerunDecision(reason=f"run {run.id} of check run {name!r} belongs to backend {run.backend!r}")
    if run.head_sha != check.get("head_sha"):
        return RerunDecision(reason=f"check run {name!r} is on head {str(check.get('head_sha'))[:12]}, run {run.id} on {run.head_sha[:12]}")
    reported = store.reported_state(run.id, "check_run")
    if reported is None or reported.external_id is None:
        return RerunDecision(reason=f"the relay created no check run for run {run.id}")
    if check.get("id") != reported.external_id:
        return RerunDecision(reason=f"check run {check.get('id')} is not the check run {reported.external_id} the relay created for run {run.id}")
    return RerunDecision(runs=(run,))


def decide_rerun(event: str, payload: dict[str, Any], store, backends: Mapping[str, BackendTarget], upstream: str,
                 app_id: str | None = None) -> RerunDecision:
    """decide_rerun(event, webhook payload, store, allowlisted backends by name, upstream repo, the relay's App id)."""
    action = payload.get("action")
    if event == "check_run":
        if action != "rerequested":
            return RerunDecision(reason=f"check_run.{action} asks for nothing")
        return _check_run_decision(payload.get("check_run") or {}, store, app_id)
    if event == "check_suite":
        if action != "rerequested":
            return RerunDecision(reason=f"check_suite.{action} asks for nothing")
        suite = payload.get("check_suite") or {}
        refusal = _app_refusal("check suite", suite, app_id)
        if refusal:
            return RerunDecision(reason=refusal)
        head_sha = str(suite.get("head_sha") or "")
        runs = _latest_per_backend(store.runs(upstream_repository=upstream, head_sha=head_sha))
        # The suite holds only the check runs the relay reported: re-run those backends, not every one.
        checked = {s.run_pk for s in store.reported_states([r.id for r in runs])
                   if s.target == "check_run" and s.external_id is not None}
        runs = [r for r in runs if r.id in checked]
        if not runs:
            return RerunDecision(reason=f"none of the relay's check runs is on {head_sha[:12]}")
        return RerunDecision(runs=tuple(runs))
    if event == "issue_comment":
        if action != "created":
            return RerunDecision(reason=f"issue_comment.{action} is not a new comment")
        comment = payload.get("comment") or {}
        is_retest, backend = parse_retest(str(comment.get("body") or ""))
        if not is_retest:
            return RerunDecision(reason="the comment is not a /retest command")
        issue = payload.get("issue") or {}
        if not issue.get("pull_request"):
            return RerunDecision(reason="/retest on an issue, not a pull request")
        author = (comment.get("user") or {}).get("login")
        association = comment.get("author_association")
        if association not in RETEST_ASSOCIATIONS:
            return RerunDecision(reason=f"/retest by {author} ({association}) ignored: only OWNER, MEMBER or COLLABORATOR may ask")
        if backend is not None and backend not in backends:
            return RerunDecision(reason=f"/retest {backend}: no such backend; known: {', '.join(sorted(backends))}")
        number = issue.get("number")
        if not isinstance(number, int) or isinstance(number, bool):
            return RerunDecision(reason="/retest on a comment without issue.number: no pull request to repeat")
        pr = store.pull_request(upstream, number)
        runs = store.runs(upstream_repository=upstream, pr_number=number, backend=backend,
                          head_sha=pr.head_sha if pr is not None else None)
        runs = _latest_per_backend(runs)
        if not runs:
            who = f"backend {backend}" if backend else "any backend"
            return RerunDecision(reason=f"/retest: {who} has no run on PR #{number} to repeat")
        return RerunDecision(runs=tuple(runs))
    return RerunDecision(reason=f"{event} is not a re-run request")


class RerunWatcher(RunsPeriodically):
    """Polls stored re-run requests, decides, and writes the new dispatches (one transaction each)."""

    def __init__(self, store, backends: Mapping[str, BackendTarget], *, upstream: str, app_id: str | None = None,
                 poll_seconds: float = 2.0, on_dispatched: Callable[[], None] | None = None):
        self.store = store
        self.backends = dict(backends)
        self.upstream = upstream
        self.app_id = app_id  # the relay's GitHub App: only its check runs and suites are re-run
        self.poll_seconds = poll_seconds
        self.on_dispatched = on_dispatched  # the dispatcher's wake()
        self._periodic = PeriodicThread("relay-reruns", poll_seconds, self.poll_once)

    def handle(self, delivery: DeliveryView) -> tuple[str, str | None, list[str]]:
        """Act on one stored request: dispatch again, or record why not."""
        try:
            payload = json.loads(delivery.payload or "{}")
        except json.JSONDecodeError:
            payload = {}
        decision = decide_rerun(delivery.event, payload, self.store, self.backends, self.upstream, self.app_id)
        new = []
        for run in decision.runs:
            base = self.store.dispatch_payload(run.dispatch_id)
            target = self.backends.get(run.backend)
            if base is None or target is None:
                continue
            nonce = secrets.token_urlsafe(24)
            body = {**base, "nonce": nonce, "delivery": delivery.delivery_id}
            new.append(NewDispatch(backend=run.backend, repository=target.repository, event_type=run.event,
                                   client_payload=body, nonce=nonce))
        outcome = "dispatched" if new else "ignored"
        reason = decision.reason if not new else None
        if self.store.record_rerun(delivery.delivery_id, outcome=outcome, reason=reason, new_dispatches=new):
            if new:
                log.info("re-run dispatched", extra={"delivery": delivery.delivery_id, "event": delivery.event,
                                                     "backends": [d.backend for d in new]})
                if self.on_dispatched is not None:
                    self.on_dispatched()
            else:
                log.info("re-run request ignored", extra={"delivery": delivery.delivery_id, "event": delivery.event,
                                                          "reason": reason})
        return outcome, reason, [d.backend for d in new]

    def poll_once(self) -> int:
        pending = self.store.unhandled_rerun_requests()
        for delivery in pending:
            try:
                self.handle(delivery)
            except StoreUnavailable:
                raise  # the store is at fault, not the request: the next poll tries again
            except Exception as exc:  # noqa: BLE001 - one request that cannot be handled never stops the others
                error = f"{type(exc).__name__}: {exc}"
                log.error("re-run request quarantined", extra={"delivery": delivery.delivery_id, "error": error})
                self.store.quarantine_row(RERUNS, f"delivery {delivery.delivery_id}", error)
        return len(pending)
