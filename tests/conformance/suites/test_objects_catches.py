"""The ``objects`` suite catches what it claims: a recv_object_list that reorders the objects, and a
gather_object that takes the group rank of its root for a global rank, each fail with a message naming
the backend, the rank and the operation; the real ones pass."""

from __future__ import annotations

import pytest

from conformance.suites import test_objects as objects
from tests.conformance.suites._caught import caught

BROKEN = "tests.conformance.suites._broken_objects:"

pytestmark = pytest.mark.world_size(2)  # the messages asserted name the ranks of a 2-rank run


def test_a_recv_object_list_that_reorders(ranks):
    caught(objects.check_object_lists, ranks, impl=BROKEN + "RECV_OBJECTS_REVERSED",
           match=r"send_object_list/recv_object_list over gloo is wrong:\n  rank 1: recv_object_list from rank 0: "
                 r"got \[\{'rank': 2, ")


def test_a_gather_object_rooted_by_global_rank(ranks):
    caught(objects.check_subgroup_objects, ranks, impl=BROKEN + "GATHER_OBJECT_GROUP_DST_AS_GLOBAL",
           match=r"object collectives on a sub-group over gloo is wrong:\n  rank 1: gather_object on group \[1\] "
                 r"\(root: group rank 0 = rank 1\) raised ")
