"""Deliberately broken DTensor argmax/argmin handlers, handed to the suite by import path.

Each has the handler signature ``(dtensor, op, dim, keepdim) -> DTensor``; the suite's rank function
imports this module on every rank (``handler="tests.conformance.suites._broken_argminmax:NAME"``).
"""

from __future__ import annotations


def max_of_local_indices(dtensor, op, dim, keepdim):
    """Each rank's arg-extreme of its own shard, then the largest of those *local* indices."""
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Replicate

    local = getattr(torch, op)(dtensor.to_local(), dim=dim, keepdim=keepdim)
    reduced = funcol.wait_tensor(funcol.all_reduce(local, "max", dtensor.device_mesh.get_group()))
    return DTensor.from_local(reduced, dtensor.device_mesh, [Replicate()], run_check=False)


def partial_output(dtensor, op, dim, keepdim):
    """The right indices, declared Partial: summing index tensors across ranks means nothing."""
    import torch
    from torch.distributed.tensor import DTensor, Partial

    full = getattr(torch, op)(dtensor, dim=dim, keepdim=keepdim).full_tensor()
    local = full if dtensor.device_mesh.get_local_rank() == 0 else torch.zeros_like(full)
    return DTensor.from_local(local, dtensor.device_mesh, [Partial()], run_check=False)


def crash_on_dim_0(dtensor, op, dim, keepdim):
    """The real op, except that it raises (on every rank, before any collective) when dim == 0."""
    import torch

    if dim == 0:
        raise RuntimeError("deliberate crash of the handler for dim=0")
    return getattr(torch, op)(dtensor, dim=dim, keepdim=keepdim)


def crash_on_rank_0(dtensor, op, dim, keepdim):
    """The real op, except that rank 0 raises before any collective when dim == 1: its peers are left
    waiting in the op's collectives (the desynchronisation the matrix must survive)."""
    import torch

    if dim == 1 and dtensor.device_mesh.get_rank() == 0:
        raise RuntimeError("deliberate crash of the handler on rank 0 only")
    return getattr(torch, op)(dtensor, dim=dim, keepdim=keepdim)
