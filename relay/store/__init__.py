"""The relay's store: the only package that talks SQL (SQLAlchemy 2 + Alembic migrations).

Module map (one concept each): ``deliveries`` (accepted webhooks, the dedupe key), ``dispatches`` (the
outbox and its state machine), ``pull_requests`` (labels per PR), ``backends`` (the allowlist as
synced), ``base`` (declarative base), ``models`` (every table), ``database`` (engine, URL, migrations),
``store`` (:class:`Store`: the operations, one transaction each), ``group_commit`` (intake's writer
thread: one transaction for every webhook pending). Migrations live in ``migrations/`` and run at
every start-up.

To add a concept (part 2: runs, test results): a new module with its table(s) subclassing ``Base`` and
functions taking a ``Session``; import it in ``models.py``; add ``migrations/versions/0002_<name>.py``
with ``down_revision = "0001"``; expose its operations as ``Store`` methods.

The re-exports below are imported on first use, so a module that needs one table (or the ``relay``
command's argument parser) does not load the whole store, Alembic included.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BackendRecord": "relay.store.backends",
    "ClaimedDispatch": "relay.store.dispatches",
    "DeliveryView": "relay.store.deliveries",
    "DispatchState": "relay.store.dispatches",
    "DispatchView": "relay.store.dispatches",
    "NewDelivery": "relay.store.deliveries",
    "NewDispatch": "relay.store.dispatches",
    "PullRequestSnapshot": "relay.store.pull_requests",
    "Store": "relay.store.store",
    "StoreRefused": "relay.store.errors",
    "StoreUnavailable": "relay.store.store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'relay.store' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
