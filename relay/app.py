"""The relay's FastAPI application: ``create_app(settings)`` wires every part and lists every router.

Triggered by ``relay serve`` (uvicorn) and by tests. Reads the settings and the backend descriptors
(the allowlist); at start-up migrates the store, records the allowlist in it and starts the dispatcher;
at shutdown stops the dispatcher (in-flight calls finish) and closes the store. The descriptors are
read again on SIGHUP and when their files change (:mod:`relay.descriptor_reload`); ``use_allowlist``
hands the new targets to every part.

Endpoints (one router each): ``POST /github/webhook`` (:mod:`relay.intake`), ``GET /healthz``, ``GET /readyz`` and
``GET /metrics`` (:mod:`relay.observability`), ``POST /github/callback`` (:mod:`relay.callbacks`), the
dashboard pages and their ``/api/...`` (:mod:`relay.dashboard`), ``/static`` (dashboard assets), ``/docs``
(served locally) and the security headers of every response (:mod:`relay.security_headers`).
The results side's workers (reporting, sweeper, re-run watcher: :mod:`relay.wiring`) start and stop
with the dispatcher.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI

from conformance.descriptors import packaged_backends_dir

from relay import dashboard, wiring
from relay.intake import routes as intake
from relay.results import receiver as callbacks
from relay.web import health as observability
from relay.web import security_headers
from relay.levels.allowlist_reload import DescriptorReload
from relay.dispatch.dispatcher import Dispatcher
from relay.github import DispatchSender, GitHubClient
from relay.parts import RelayParts
from relay.web.request_body import BodyBudget
from relay.settings import Settings
from relay.store import Store, StoreUnavailable
from relay.trust import load_allowlist

__all__ = ["create_app"]

log = logging.getLogger("relay.app")


def create_app(settings: Settings, *, github: DispatchSender | None = None) -> FastAPI:
    """create_app(settings) -> FastAPI app; ``github`` replaces the GitHub client (tests, embedding)."""
    backends_dir = settings.backends_dir or packaged_backends_dir()
    allowlist = load_allowlist(backends_dir)
    store = Store(settings.database_url, deadline_seconds=settings.store_deadline_seconds,
                  replay_window_seconds=settings.replay_window_hours * 3600)
    metrics = observability.Metrics(store)
    github = github or GitHubClient.from_settings(settings)

    dispatcher = Dispatcher.from_settings(settings, store, github, metrics) if settings.dispatcher_enabled else None
    results = wiring.build(settings, backends_dir=backends_dir, allowlist=allowlist, store=store, github=github,
                           metrics=metrics, dispatcher=dispatcher)

    def use_allowlist(targets) -> None:
        parts.allowlist = targets  # intake routing and the dashboard read it per request
        results.use_allowlist(targets)

    descriptors = DescriptorReload(backends_dir, store, use_allowlist, interval_seconds=settings.descriptor_check_seconds,
                                   on_level_changed=results.run_changed)
    parts = RelayParts(
        settings=settings, secrets=settings.secret_values(),
        body_budget=BodyBudget(settings.unauthenticated_body_budget_bytes), allowlist=allowlist, store=store,
        metrics=metrics, github=github, dispatcher=dispatcher, results=results, descriptors=descriptors,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        store.migrate()
        descriptors.record(parts.allowlist)
        if dispatcher is not None:
            dispatcher.start()
        results.start()
        descriptors.start()
        log.info("relay started", extra={"upstream": settings.upstream_repo, "backends": [t.name for t in allowlist],
                                         "store": store.safe_url})
        try:
            yield
        finally:
            descriptors.stop()
            results.stop()
            if dispatcher is not None:
                dispatcher.stop()
            store.close()

    app = FastAPI(title="relay", summary="upstream webhooks in, downstream repository_dispatch out", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    security_headers.install(app)
    app.state.parts = parts  # the one attribute: routes read it through relay.parts.parts_of
    app.add_exception_handler(intake.WebhookRejected, intake.rejection_handler)
    app.add_exception_handler(callbacks.CallbackRejected, callbacks.rejection_handler)
    app.add_exception_handler(StoreUnavailable, observability.store_unavailable_handler)

    app.include_router(intake.router)
    app.include_router(observability.router)
    app.include_router(callbacks.router)
    app.include_router(dashboard.router)
    app.mount("/static", dashboard.static_files(), name="static")
    return app
