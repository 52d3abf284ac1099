"""CI relay: upstream GitHub webhooks in, downstream ``repository_dispatch`` out, results back as checks.

Follow a webhook through the modules: ``app`` (every router) -> ``intake`` (verify, normalise with
``events``, route with ``trust``, store) -> ``store/`` (delivery + outbox rows, one transaction) ->
``dispatch`` (claim, send through ``github``, record the outcome and the run it starts).
Follow a result back: ``callbacks`` (who calls: ``oidc``; which transition: ``run_states``) ->
``store/`` (the run and its per-test results) -> ``reporting`` (check run or commit status, by
``trust`` level, through ``github``); ``sweeper`` times out runs whose callbacks never came,
``rerun`` dispatches again on request, ``level_review`` recommends promotions and demotions,
``level_watch`` holds a backend found below its level's bar, ``proposals`` opens level changes (and
quarantine releases) as pull requests on the descriptor repository with ``descriptor_edits``,
``descriptor_reload`` applies edited descriptors (a level change re-decides open PRs' checks), and
``dashboard/`` shows it all. ``wiring`` assembles the results side's parts; ``settings`` is the
configuration, ``observability`` the logs, ``/healthz``, ``/readyz`` and ``/metrics``, ``cli`` the ``relay``
command, and ``testing/`` a fake GitHub and OIDC issuer for tests (also for backend owners).

The package never imports torch; of ``conformance`` it reads only ``conformance.descriptors`` (the
allowlist) and ``conformance.report`` (the report schema callbacks validate against).
The re-exports below are imported on first use, so ``relay --help`` does not load FastAPI and SQLAlchemy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "create_app": ("relay.app", "create_app"),
    "Settings": ("relay.settings", "Settings"),
    "SettingsError": ("relay.settings", "SettingsError"),
    "load_settings": ("relay.settings", "load_settings"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'relay' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
