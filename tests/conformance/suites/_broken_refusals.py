"""A deliberately broken float8 reduction for the ``refusals`` suite (a ``BrokenDist``, see
``tests.conformance.suites._broken_dist``)."""

from __future__ import annotations

from tests.conformance.suites._broken_dist import BrokenDist, _dist


def _all_reduce_float8_as_bytes(tensor, op=None, group=None, async_op=False):
    """Reduces a float8 tensor as if its bytes were uint8 integers (garbage) instead of refusing it."""
    import torch

    dist = _dist()
    if tensor.dtype.itemsize == 1 and tensor.is_floating_point():
        as_int = tensor.view(torch.uint8).to(torch.int32)
        dist.all_reduce(as_int, group=group)
        tensor.view(torch.uint8).copy_(as_int.to(torch.uint8))
        return None
    return dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, group=group, async_op=async_op)


FLOAT8_REDUCED_AS_BYTES = BrokenDist(all_reduce=_all_reduce_float8_as_bytes)
