"""The ``dtensor_promises`` suite catches what it claims: a redistribute cut off from autograd, a Partial
relabelled without its reduction, a _StridedShard taken for a plain
Shard, a sub-mesh group that is the world's, a to_local cut off from autograd, a from_local that reduces its
gradient and a split piece whose gradient lands on other rows each fail with a message naming the backend, the rank and the operation;
the real ones pass."""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import test_dtensor_promises as promises
from tests.conformance.suites._caught import caught

BROKEN = "tests.conformance.suites._broken_dtensor_promises:"

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


def test_a_to_local_cut_off_from_autograd_loses_the_dtensor_path(ranks):
    caught(promises.check_local_gradients, ranks, "mixed_paths", to_local=BROKEN + "to_local_detached",
           match=r"DTensor gradients across from_local/to_local \(mixed_paths\) over gloo is wrong:\n  rank 0: x.grad "
                 r"gradient: differs first at \(0, 0\): got 3.0, expected 5.0")


def test_a_to_local_cut_off_from_autograd_has_no_gradient_to_give(ranks):
    caught(promises.check_local_gradients, ranks, "allow_unused", to_local=BROKEN + "to_local_detached",
           match=r"\(allow_unused\) over gloo is wrong:\n  rank 0: backward raised RuntimeError: element 0 of "
                 r"tensors does not require grad")


def test_a_from_local_that_reduces_its_gradient(ranks):
    caught(promises.check_local_gradients, ranks, "mixed_paths", from_local=BROKEN + "from_local_scaling_its_gradient",
           match=r"\(mixed_paths\) over gloo is wrong:\n  rank 0: x.grad gradient: differs first at \(0, 0\): got 7.0, "
                 r"expected 5.0")


@pytest.mark.parametrize("case", ["unused_split_output", "unused_unbind_output"])
def test_an_unused_piece_check_passes_where_its_none_gradient_is_handled_and_catches_a_misplaced_one(ranks, case):
    """torch 2.13-2.15 fail these cases (a known failure: docs/known-bugs.md), so the check's passing side is
    shown with pieces taken by slicing, which is what a fixed torch computes."""
    promises.check_local_gradients(ranks, case, splitter=BROKEN + "first_piece_by_slicing")
    with pytest.raises(ConformanceFailure, match=rf"\({case}\) over gloo is wrong:\n  rank 0: the input's gradient: "
                                                 r"differs first at \(0, 0\): got 0.0, expected 1.0"):
        promises.check_local_gradients(ranks, case, splitter=BROKEN + "first_piece_gradient_misplaced")
