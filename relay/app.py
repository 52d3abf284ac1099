"""The relay's FastAPI application: ``create_app(settings)`` builds the parts and lists every router.

Triggered by ``relay serve`` (uvicorn) and by tests. The parts (:mod:`relay.assembly`) are built from the
settings and the backend descriptors (the allowlist); at start-up the app migrates the store, records
the allowlist in it and starts the background workers; at shutdown it stops them (in-flight calls
finish) and closes the store. The descriptors are read again on SIGHUP and when their files change
(:mod:`relay.levels.allowlist_reload`).

Endpoints (one router each): ``POST /github/webhook`` (:mod:`relay.intake.routes`), ``GET /healthz``,
``GET /readyz``, ``GET /metrics`` and ``GET /api/quarantine`` (:mod:`relay.web.health`),
``POST /github/callback`` (:mod:`relay.results.routes`), the dashboard pages and their ``/api/...``
(:mod:`relay.dashboard`), ``/static`` (dashboard assets), ``/docs`` (served locally) and the security
headers of every response (:mod:`relay.web.security_headers`).
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI

from relay import dashboard
from relay.github import DispatchSender
from relay.intake import routes as intake_routes
from relay.assembly import build_parts
from relay.results import routes as callback_routes
from relay.settings import Settings
from relay.store import StoreRefused, StoreUnavailable
from relay.web import health, security_headers

__all__ = ["create_app"]

log = logging.getLogger("relay.app")


def create_app(settings: Settings, *, github: DispatchSender | None = None) -> FastAPI:
    """create_app(settings) -> FastAPI app; ``github`` replaces the GitHub client (tests, embedding)."""
    parts = build_parts(settings, github=github)
    store, dispatcher, results, descriptors = parts.store, parts.dispatcher, parts.results, parts.descriptors

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        store.migrate()
        descriptors.record(parts.allowlist)
        if dispatcher is not None:
            dispatcher.start()
        results.start()
        descriptors.start()
        log.info("relay started", extra={"upstream": settings.upstream_repo,
                                         "backends": [t.name for t in parts.allowlist], "store": store.safe_url})
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
    app.state.parts = parts  # the one attribute: routes read it through relay.web.app_parts
    app.add_exception_handler(intake_routes.WebhookRejected, intake_routes.rejection_handler)
    app.add_exception_handler(callback_routes.CallbackRejected, callback_routes.rejection_handler)
    app.add_exception_handler(StoreUnavailable, health.store_unavailable_handler)
    app.add_exception_handler(StoreRefused, health.store_refused_handler)

    app.include_router(intake_routes.router)
    app.include_router(health.router)
    app.include_router(callback_routes.router)
    app.include_router(dashboard.router)
    app.mount("/static", dashboard.static_files(), name="static")
    return app
