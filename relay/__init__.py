"""CI relay: upstream GitHub webhooks in, downstream ``repository_dispatch`` out, results back as checks.

One folder per flow, over shared vocabulary (see ``docs/internals.md``):

* ``intake/``: a signed webhook -> ``routes`` -> ``events`` (normalised) -> ``trust`` (routed) -> ``store/`` (delivery
  and outbox rows, one transaction);
* ``dispatch/``: outbox rows -> ``repository_dispatch`` through ``github``; re-run requests -> outbox rows;
* ``results/``: a callback (``routes``; who calls: ``oidc``) -> ``receiver`` (which transition:
  ``store/run_states``) -> ``store/`` -> ``reporter`` (``verdict`` and ``summary``: a check run or commit status
  by ``trust`` level, through ``github``); ``sweeper`` times out runs whose callbacks never came;
* ``levels/``: the level review, level holds, level-change pull requests, the descriptor reload and
  the ``relay levels`` commands;
* ``web/``: what routes share, and ``/healthz``, ``/readyz``, ``/metrics``; ``dashboard/``: the pages.

``app`` lists every router, ``assembly`` builds every part, ``cli`` is the ``relay`` command; ``settings``,
``metrics``, ``logs`` and ``periodic`` (every background worker's thread) are shared; ``testing/`` holds a
fake GitHub and OIDC issuer for tests (also for backend owners).

The package never imports torch; of ``conformance`` it reads only ``conformance.descriptors`` (the
allowlist), ``conformance.report`` (the report schema callbacks validate against) and
``conformance.provenance`` (whether a report's torch is the dispatched commit: the rule the CI job applies too).
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
