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
