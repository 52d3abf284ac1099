"""The ``refusals`` suite catches a float8 all_reduce that answers with garbage instead of refusing,
with a message naming the backend, the rank and the operation; the real one (gloo refuses) passes."""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import test_refusals as refusals

pytestmark = pytest.mark.world_size(2)  # the messages asserted name the ranks of a 2-rank run


def test_a_float8_reduction_that_answers_garbage(ranks):
    refusals.check_float8_reduction(ranks, "float8_e4m3fn", "SUM")
    with pytest.raises(ConformanceFailure, match=r"all_reduce\(SUM\) on float8_e4m3fn over gloo is wrong:\n  rank 0: "
                                                 r"all_reduce\(SUM\) returned a wrong result instead of raising: \d+ of 8 "
                                                 r"elements differ bitwise"):
        refusals.check_float8_reduction(ranks, "float8_e4m3fn", "SUM", impl="tests.conformance.suites._broken_refusals:FLOAT8_REDUCED_AS_BYTES")
