"""The relay's store: the only package that talks SQL (SQLAlchemy 2 + Alembic migrations).

Module map (one concept each): ``deliveries`` (accepted webhooks, the dedupe key), ``dispatches`` (the
outbox and its state machine), ``pull_requests`` (labels per PR), ``backends`` (the allowlist as
synced), ``base`` (declarative base), ``models`` (every table), ``database`` (engine, URL, migrations),
``store`` (:class:`Store`: the operations, one transaction each). Migrations live in ``migrations/``
and run at every start-up.

To add a concept (part 2: runs, test results): a new module with its table(s) subclassing ``Base`` and
functions taking a ``Session``; import it in ``models.py``; add ``migrations/versions/0002_<name>.py``
with ``down_revision = "0001"``; expose its operations as ``Store`` methods.
"""

from relay.store.backends import BackendRecord
from relay.store.deliveries import DeliveryView, NewDelivery
from relay.store.dispatches import ClaimedDispatch, DispatchState, DispatchView, NewDispatch
from relay.store.pull_requests import PullRequestSnapshot
from relay.store.store import Store, StoreUnavailable

__all__ = [
    "BackendRecord",
    "ClaimedDispatch",
    "DeliveryView",
    "DispatchState",
    "DispatchView",
    "NewDelivery",
    "NewDispatch",
    "PullRequestSnapshot",
    "Store",
    "StoreUnavailable",
]
