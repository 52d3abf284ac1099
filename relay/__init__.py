"""CI relay: upstream GitHub webhooks in, downstream ``repository_dispatch`` out (results back in part 2).

Follow a webhook through the modules: ``app`` (every router) -> ``intake`` (verify, normalise with
``events``, route with ``tiers``, store) -> ``store/`` (delivery + outbox rows, one transaction) ->
``dispatch`` (claim, send through ``github``, record the outcome). ``settings`` is the configuration,
``observability`` the logs, ``/healthz`` and ``/metrics``, ``cli`` the ``relay`` command, and
``testing.fake_github`` a fake GitHub server for tests (also for backend owners).

The package never imports torch, nor any ``conformance`` module but ``conformance.descriptors``.
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
