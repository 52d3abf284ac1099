"""Deliberately broken ``batch_isend_irecv`` stand-ins for the ``p2p_ordering`` suite (``BrokenDist``s,
see ``tests.conformance.suites._broken_dist``): each wrong in one way a backend's batching could be."""

from __future__ import annotations

from tests.conformance.suites._broken_dist import BrokenDist, _dist


def _swapping_first_two_sends_per_peer(p2p_op_list):
    """Posts the first two sends to each peer the other way round (one message per peer is unchanged)."""
    ops, seen = list(p2p_op_list), {}
    dist = _dist()
    for i, op in enumerate(ops):
        if getattr(op, "op", None) is dist.isend:
            seen.setdefault(op.peer, []).append(i)
    for first, second, *_ in (v for v in seen.values() if len(v) >= 2):
        ops[first], ops[second] = ops[second], ops[first]
    return dist.batch_isend_irecv(ops)


def _dropping_tags(p2p_op_list):
    """Posts every op with tag 0: the receives then match in posting order, whatever their tags."""
    for op in p2p_op_list:
        op.tag = 0
    return _dist().batch_isend_irecv(p2p_op_list)


def _skipping_what_is_not_a_p2p_op(p2p_op_list):
    """Leaves out what is not a P2POp instead of refusing the list."""
    dist = _dist()
    ops = [op for op in p2p_op_list if isinstance(op, dist.P2POp)]
    return dist.batch_isend_irecv(ops) if ops else []


BATCH_SAME_PEER_SWAPPED = BrokenDist(batch_isend_irecv=_swapping_first_two_sends_per_peer)
BATCH_TAGS_DROPPED = BrokenDist(batch_isend_irecv=_dropping_tags)
BATCH_SKIPS_NON_P2P_OPS = BrokenDist(batch_isend_irecv=_skipping_what_is_not_a_p2p_op)
