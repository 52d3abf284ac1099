"""Every table of the store, imported in one place so that ``Base.metadata`` is complete.

Read by the Alembic environment and by tests that compare the migrated schema with the models.
Part 2 adds its concept modules (runs, test results) to this list.
"""

from relay.store.backends import BackendRow
from relay.store.base import Base
from relay.store.deliveries import Delivery
from relay.store.dispatches import Dispatch
from relay.store.pull_requests import PullRequest

__all__ = ["BackendRow", "Base", "Delivery", "Dispatch", "PullRequest"]
