"""The relay's parts, as one typed record: what ``create_app`` builds and every route reads.

Built once by :func:`relay.app.create_app`, in order (each part from the ones before it), and kept on
the app (``app.state.parts``); routes reach it with ``parts_of(request)``, so each use names a typed
attribute instead of an untyped ``app.state`` one. Only ``allowlist`` changes after start-up: a
descriptor reload replaces it (intake's routing and the dashboard read it per request).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

    from relay.results.receiver import CallbackService
    from relay.levels.allowlist_reload import DescriptorReload
    from relay.dispatch.dispatcher import Dispatcher
    from relay.github import DispatchSender
    from relay.web.health import Metrics
    from relay.web.request_body import BodyBudget
    from relay.settings import Settings
    from relay.store import Store
    from relay.trust import BackendTarget
    from relay.wiring import ResultsSide

__all__ = ["RelayParts", "parts_of"]


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


def parts_of(where: Request | FastAPI) -> RelayParts:
    """The parts of the app serving ``where`` (a request, or the app itself)."""
    app = where.app if hasattr(where, "scope") else where
    return app.state.parts
