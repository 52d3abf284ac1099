"""Deliberately broken object functions for the ``objects`` suite (``BrokenDist``s, see
``tests.conformance.suites._broken_dist``)."""

from __future__ import annotations

from tests.conformance.suites._broken_dist import BrokenDist, _dist


def _recv_object_list_reversed(object_list, src=None, group=None, device=None, group_src=None, **kwargs):
    sender = _dist().recv_object_list(object_list, src=src, group=group, device=device, group_src=group_src, **kwargs)
    object_list.reverse()
    return sender


def _gather_object_to_global_rank(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Takes ``group_dst`` for a global rank."""
    return _dist().gather_object(obj, object_gather_list, dst=group_dst if group_dst is not None else dst, group=group)


RECV_OBJECTS_REVERSED = BrokenDist(recv_object_list=_recv_object_list_reversed)
GATHER_OBJECT_GROUP_DST_AS_GLOBAL = BrokenDist(gather_object=_gather_object_to_global_rank)
