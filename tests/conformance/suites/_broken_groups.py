"""Deliberately broken group handling for the ``subgroups`` suite (``BrokenDist``s, see
``tests.conformance.suites._broken_dist``)."""

from __future__ import annotations

from tests.conformance.suites._broken_dist import BrokenDist, _dist


def _all_gather_into_tensor_clearing_non_members(output_tensor, input_tensor, group=None, async_op=False):
    """Right for members; a rank outside the group gets its output buffer zeroed instead of left alone."""
    dist = _dist()
    if group is not None and dist.get_rank(group) < 0:
        output_tensor.zero_()
        return None
    return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def _broadcast_src_as_group_rank(tensor, src=None, group=None, async_op=False, group_src=None):
    """Takes the global ``src`` for a rank within the group when it can be one (else the group's first):
    right only when the two coincide."""
    dist = _dist()
    if group is None or dist.get_rank(group) < 0:
        return dist.broadcast(tensor, src=src, group=group, async_op=async_op, group_src=group_src)
    size = dist.get_world_size(group)
    return dist.broadcast(tensor, group=group, async_op=async_op, group_src=src if src < size else 0)


NON_MEMBER_OUTPUT_CLEARED = BrokenDist(all_gather_into_tensor=_all_gather_into_tensor_clearing_non_members)
BROADCAST_SRC_AS_GROUP_RANK = BrokenDist(broadcast=_broadcast_src_as_group_rank)
