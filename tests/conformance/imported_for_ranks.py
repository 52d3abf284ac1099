"""A module a pool's ranks are told they will import (``RankPool(rank_imports=...)``): it records which process
imported it and the marker of that process's environment, so a rank can tell whether its fork server imported
it before forking the rank, under the rank's environment."""

import os

IMPORTED_BY_PID = os.getpid()
MARKER_AT_IMPORT = os.environ.get("CONFORMANCE_TEST_MARKER")
