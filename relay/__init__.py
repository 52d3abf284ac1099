"""CI relay: upstream GitHub webhooks in, downstream ``repository_dispatch`` out (results back in part 2).

Follow a webhook through the modules: ``app`` (every router) -> ``intake`` (verify, normalise with
``events``, route with ``tiers``, store) -> ``store/`` (delivery + outbox rows, one transaction) ->
``dispatch`` (claim, send through ``github``, record the outcome). ``settings`` is the configuration,
``observability`` the logs, ``/healthz`` and ``/metrics``, ``cli`` the ``relay`` command, and
``testing.fake_github`` a fake GitHub server for tests (also for backend owners).

The package never imports torch, nor any ``conformance`` module but ``conformance.descriptors``.
"""

from relay.app import create_app
from relay.settings import Settings, SettingsError, load_settings

__all__ = ["Settings", "SettingsError", "create_app", "load_settings"]
