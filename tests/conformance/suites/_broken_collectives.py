"""Deliberately broken collectives, handed to the typed-collectives suite by import path.

Each is a ``CollectiveSet`` that differs from the real one in one way; the suite's rank functions
import this module on every rank (``impl="tests.conformance.suites._broken_collectives:NAME"``).
"""

from __future__ import annotations

import dataclasses


class _ReduceWithoutBackward:
    """An all_reduce whose forward is right and whose backward hands the gradient back unreduced."""

    @staticmethod
    def function():
        import torch

        class SkipBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, reduced):
                return reduced.clone()

            @staticmethod
            def backward(ctx, grad):
                return grad, None

        return SkipBackward


def _raw_all_gather_rotated(x, group):
    import torch
    from conformance.suites._collective_impls import torch_collectives

    out = torch_collectives().raw_all_gather(x, group)
    return torch.roll(out, shifts=x.shape[0], dims=0)  # rank r's rows land in rank r+1's slot


def _typed_all_gather_rotated(x, axis, *, src, dst, **kwargs):
    import torch
    import spmd_types

    out = spmd_types.all_gather(x, axis, src=src, dst=dst, **kwargs)
    dim = src.dim % x.ndim if isinstance(src, spmd_types.Shard) else 0
    step = x.shape[dim] if isinstance(src, spmd_types.Shard) else 1
    return torch.roll(out, shifts=step, dims=dim)


def _raw_all_reduce_no_backward(x, group):
    from conformance.suites._collective_impls import torch_collectives

    reduced = torch_collectives().raw_all_reduce(x.detach(), group)
    return _ReduceWithoutBackward.function().apply(x, reduced)


def _typed_all_reduce_no_backward(x, axis, *, src, dst, **kwargs):
    import spmd_types

    real = spmd_types.all_reduce(x, axis, src=src, dst=dst, **kwargs)
    with spmd_types.no_typecheck():
        out = _ReduceWithoutBackward.function().apply(x, real.detach())
    return spmd_types.assert_type(out, dict(spmd_types.get_local_type(real)))


def _typed_all_gather_lenient(x, axis, *, src, dst, **kwargs):
    """Accepts any source type: the misuse the checker exists to refuse goes through."""
    import spmd_types

    with spmd_types.no_typecheck():
        out = spmd_types.all_gather(x.detach(), axis, src=spmd_types.V, dst=dst, **kwargs)
    return spmd_types.assert_type(out, {axis: dst})


def _replace(**changes):
    from conformance.suites._collective_impls import torch_collectives

    return lambda: dataclasses.replace(torch_collectives(), **changes)


GATHER_WRONG_ORDER = _replace(name="all_gather in the wrong rank order", raw_all_gather=_raw_all_gather_rotated,
                              all_gather=_typed_all_gather_rotated)
ALL_REDUCE_NO_BACKWARD = _replace(name="all_reduce whose backward does nothing",
                                  raw_all_reduce=_raw_all_reduce_no_backward,
                                  all_reduce=_typed_all_reduce_no_backward)
LENIENT_ALL_GATHER = _replace(name="all_gather that accepts any source type", all_gather=_typed_all_gather_lenient)
