"""The ``subgroups`` suite catches what it claims: a collective that ignores its group, one that touches
the buffers of a rank outside the group, and one that takes a global root for a group rank each fail
with a message naming the backend, the rank, the group and the collective; the real ones pass."""

from __future__ import annotations

import pytest

from conformance.suites import test_subgroups as subgroups
from tests.conformance.suites._caught import caught


@pytest.mark.world_size(2)  # the message asserted names the groups of a 2-rank run
def test_an_all_reduce_that_ignores_its_group(ranks):
    caught(subgroups.check_subgroup_collectives, ranks, "all_but_rank_0", "int64",
           impl="tests.conformance.suites._broken_dist:ALL_REDUCE_IGNORES_GROUP",
           match=r"collectives on sub-groups \[\[1\]\] of 2 ranks on int64 over gloo is wrong:\n  rank 0: all_reduce on "
                 r"group \[1\] \(non-member\): its buffer was touched: \d+ of 17 elements differ bitwise.*\n  rank 1: "
                 r"all_reduce on group \[1\] \(member\): result: \d+ of 17 elements differ")


@pytest.mark.world_size(2)  # the message asserted names the groups of a 2-rank run
def test_a_collective_that_writes_into_a_non_member(ranks):
    caught(subgroups.check_subgroup_collectives, ranks, "two_halves", "float32",
           impl="tests.conformance.suites._broken_groups:NON_MEMBER_OUTPUT_CLEARED",
           match=r"collectives on sub-groups \[\[0\], \[1\]\] of 2 ranks on float32 over gloo is wrong:\n  rank 0: "
                 r"all_gather_into_tensor on group \[1\] \(non-member\): its buffer was touched: \d+ of 17 elements "
                 r"differ bitwise, first at flat index 0: got bytes 00000000 \(0.0\)")


@pytest.mark.world_size(4)
def test_a_broadcast_that_takes_the_global_root_for_a_group_rank(ranks):
    caught(subgroups.check_subgroup_collectives, ranks, "odd_ranks", "int64",
           impl="tests.conformance.suites._broken_groups:BROADCAST_SRC_AS_GROUP_RANK",
           match=r"collectives on sub-groups \[\[1, 3\]\] of 4 ranks on int64 over gloo is wrong:\n  rank 1: broadcast "
                 r"on group \[1, 3\] \(member\): result: \d+ of 17 elements differ bitwise")
