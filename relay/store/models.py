"""Every table of the store, imported in one place so that ``Base.metadata`` is complete.

Read by the Alembic environment and by tests that compare the migrated schema with the models.
A new concept module adds its table class here.
"""

from relay.store.backends import BackendRow
from relay.store.base import Base
from relay.store.deliveries import Delivery
from relay.store.dispatches import Dispatch
from relay.store.pull_requests import PullRequest
from relay.store.callback_nonces import ExpiredNonceRow
from relay.store.credential_gates import CredentialGateRow
from relay.store.level_holds import LevelHoldRow
from relay.store.oidc_identities import OidcIdentityRow
from relay.store.probes import StoreProbe
from relay.store.quarantine import QuarantinedRow
from relay.store.reported_states import ReportedStateRow
from relay.store.rerun_requests import RerunRequestRow
from relay.store.result_batches import ResultBatchRow
from relay.store.runs import RunRow
from relay.store.per_test_results import TestResultRow
from relay.store.worker_leases import WorkerLeaseRow

__all__ = [
    "BackendRow", "Base", "CredentialGateRow", "Delivery", "Dispatch", "ExpiredNonceRow", "LevelHoldRow", "OidcIdentityRow",
    "PullRequest", "QuarantinedRow", "RerunRequestRow", "ReportedStateRow", "ResultBatchRow", "RunRow", "StoreProbe",
    "TestResultRow", "WorkerLeaseRow",
]
