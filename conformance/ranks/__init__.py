"""How a test reaches N ranks: a persistent pool of rank processes over the backend's process group.

``pool`` is the controller, ``process`` starts and watches rank processes (fresh, or forked by
``forkserver`` from one import of torch), ``worker`` is what runs inside each rank, ``protocol`` names the messages between them, ``context`` is what a function
running on a rank receives.
"""

from conformance.ranks.context import RankContext
from conformance.ranks.pool import DEFAULT_DEVICE_ENV, RankCrashed, RankError, RankPool, RankTimeout, RemoteError
from conformance.ranks.process import FORKSERVER, SPAWN, default_start_method, fork_server_here

__all__ = ["DEFAULT_DEVICE_ENV", "FORKSERVER", "SPAWN", "RankContext", "RankCrashed", "RankError", "RankPool",
           "RankTimeout", "RemoteError", "default_start_method", "fork_server_here"]
