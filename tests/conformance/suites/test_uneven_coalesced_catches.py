"""The ``uneven_coalesced`` suite catches a coalesced all_gather that handles only the first tensor of its
list, with a message naming the backend, the rank and the operation; the real one passes. (Its uneven
all_gather check has no stand-in here: gloo refuses uneven sizes, a known failure.)"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import test_uneven_coalesced as uneven_coalesced

pytestmark = pytest.mark.world_size(2)  # the messages asserted name the ranks of a 2-rank run


def test_a_coalesced_all_gather_that_handles_one_tensor(ranks):
    uneven_coalesced.check_coalesced_direct(ranks, "int64")
    with pytest.raises(ConformanceFailure, match=r"coalesced collectives called directly on int64 over gloo is wrong:\n"
                                                 r"  rank 0: allgather_into_tensor_coalesced: tensor 1 of 3 \(17 per "
                                                 r"rank\): \d+ of 34 elements differ bitwise"):
        uneven_coalesced.check_coalesced_direct(ranks, "int64", impl="tests.conformance.suites._broken_coalesced:COALESCED_GATHERS_FIRST_ONLY")
