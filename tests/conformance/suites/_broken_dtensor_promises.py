"""Deliberately broken redistributions and sub-mesh groups for the ``dtensor_promises`` suite, handed in
by import path (``redistributor=`` / ``grouper=``)."""

from __future__ import annotations


def redistribute_detached(dtensor, mesh, placements):
    """The right values, cut off from autograd: no gradient reaches the input."""
    return dtensor.redistribute(mesh, placements).detach()


def partial_relabelled(dtensor, mesh, placements):
    """A Partial source relabelled as the target without its reduction."""
    from torch.distributed.tensor import DTensor

    if not any(p.is_partial() for p in dtensor.placements):
        return dtensor.redistribute(mesh, placements)
    return DTensor.from_local(dtensor.to_local(), mesh, placements, run_check=False)


def world_group(mesh):
    """Every sub-mesh's group taken for the whole world's."""
    import torch.distributed as dist

    return dist.group.WORLD


def strided_as_plain_shard(dtensor, mesh, placements):
    """A _StridedShard target taken for a plain Shard of the same dim."""
    from torch.distributed.tensor import Shard

    plain = [Shard(p.dim) if type(p).__name__ == "_StridedShard" else p for p in placements]
    return dtensor.redistribute(mesh, plain)


def to_local_detached(dtensor):
    """The local tensor, cut off from autograd: no gradient flows back into the DTensor."""
    return dtensor.to_local().detach()


class _ScaledBackward:
    """Identity forward; the gradient times the world size on the way back (a reduction where none belongs)."""

    @staticmethod
    def apply(local):
        import torch
        import torch.distributed as dist

        class Scaled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                return grad * dist.get_world_size()

        return Scaled.apply(local)


def from_local_scaling_its_gradient(local, mesh, placements):
    """from_local whose backward multiplies the local gradient by the world size."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(_ScaledBackward.apply(local), mesh, placements)


def first_piece_gradient_misplaced(dtensor, how):
    """The first piece's values, but its gradient lands on the last rows (a backward at the wrong offset)."""
    rows = 2 if how == "split" else 1
    last = dtensor[-rows:]
    piece = last + (dtensor[:rows] - last).detach()
    return piece if how == "split" else piece[0]


def first_piece_by_slicing(dtensor, how):
    """The first piece taken by slicing, so no other piece exists to have a None gradient: what a torch
    whose split/unbind backward handles a None gradient computes."""
    return dtensor[:2] if how == "split" else dtensor[0]
