"""The relay's store: the only package that talks SQL (SQLAlchemy 2 + Alembic migrations).

Module map (one concept each): ``deliveries`` (accepted webhooks, the dedupe key), ``dispatches`` (the
outbox and its state machine), ``pull_requests`` (labels per PR), ``backends`` (the allowlist as
synced), ``runs`` (one row per downstream run), ``per_test_results`` (one row per test of a finished
run), ``result_batches`` (a big report's results while they are written), ``reported_states`` (what reporting last wrote upstream), ``callback_nonces`` (expired nonces),
``rerun_requests`` (handled re-run requests), ``oidc_identities`` (repository ids pinned at a
backend's first OIDC callback), ``level_holds`` (backends found below their level's bar),
``worker_leases`` (which process runs a one-at-a-time worker across replicas); ``base``
(declarative base), ``models`` (every table),
``database`` (engine, URL, migrations), ``facade`` (:class:`Store`: the intake and dispatch operations,
one transaction each), ``results_operations`` (the results side's operations, mixed into ``Store``),
``group_commit`` (intake's writer thread: one transaction for every webhook pending), ``errors``
(:class:`StoreUnavailable`), ``scratch_databases`` (throw-away PostgreSQL databases for tests and
benchmarks; the relay never uses it). Migrations live in ``migrations/`` and run at every start-up.

To add a concept: a new module with its table(s) subclassing ``Base`` and functions taking a
``Session``; import it in ``models.py``; add ``migrations/versions/<next>_<name>.py`` whose
``down_revision`` is the newest revision; expose its operations as ``Store`` methods.

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
    "LevelHold": "relay.store.level_holds",
    "NewDelivery": "relay.store.deliveries",
    "NewDispatch": "relay.store.dispatches",
    "PullRequestSnapshot": "relay.store.pull_requests",
    "ScratchDatabaseInUse": "relay.store.scratch_databases",
    "ScratchTablespaceMissing": "relay.store.scratch_databases",
    "Store": "relay.store.facade",
    "StoreRefused": "relay.store.errors",
    "StoreUnavailable": "relay.store.facade",
    "create_scratch_database": "relay.store.scratch_databases",
    "drop_scratch_database": "relay.store.scratch_databases",
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
