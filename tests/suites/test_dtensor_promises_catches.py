"""The ``dtensor_promises`` suite catches what it claims: a redistribute cut off from autograd, a Partial
relabelled without its reduction, a _StridedShard taken for a plain
Shard and a sub-mesh group that is the world's each fail with a message naming the backend, the
rank and the operation; the real ones pass."""

from __future__ import annotations

import pytest

from conformance.suites import test_dtensor_promises as promises
from tests.suites._caught import caught

BROKEN = "tests.suites._broken_dtensor_promises:"

pytestmark = pytest.mark.world_size(2)  # the messages asserted name the ranks of a 2-rank run


def test_a_redistribute_cut_off_from_autograd(ranks):
    caught(promises.check_backward, ranks, "S0", "R", redistributor=BROKEN + "redistribute_detached",
           match=r"DTensor backward through redistribute S0 -> R over gloo is wrong:\n  rank 0: raised RuntimeError: "
                 r"element 0 of tensors does not require grad")


def test_a_partial_relabelled_without_its_reduction(ranks):
    caught(promises.check_partial_ops, ranks, redistributor=BROKEN + "partial_relabelled",
           match=r"DTensor ops on Partial placements over gloo is wrong:\n  rank 0: add of Partial\(sum\) DTensors, "
                 r"reduced: differs first at")


def test_a_strided_shard_taken_for_a_plain_shard(ranks):
    caught(promises.check_strided_shard, ranks, 2, redistributor=BROKEN + "strided_as_plain_shard",
           match=r"DTensor _StridedShard\(0, split_factor=2\) over gloo is wrong:\n  rank 0: local shard: differs "
                 r"first at")


def test_a_sub_mesh_group_that_is_the_world(ranks):
    caught(promises.check_mesh_slices, ranks, grouper=BROKEN + "world_group",
           match=r"device-mesh slicing and flattening of a \(1, 2\) mesh over gloo is wrong:\n  rank 0: all_reduce "
                 r"over mesh\['dp'\]'s group \(ranks \[0\]\) gave 3.0, expected 1.0")
