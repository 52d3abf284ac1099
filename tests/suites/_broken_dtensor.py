"""Deliberately broken redistributions, handed to the dtensor suite by import path.

Each has the signature ``(dtensor, mesh, placements) -> DTensor``; the suite's rank function imports
this module on every rank (``redistributor="tests.suites._broken_dtensor:NAME"``).
"""

from __future__ import annotations


def partial_max_as_sum(dtensor, mesh, placements):
    """Reads a Partial(max) source as if it were Partial(sum)."""
    from torch.distributed.tensor import DTensor, Partial

    source = [Partial("sum") if p.is_partial() and getattr(p, "reduce_op", None) == "max" else p
              for p in dtensor.placements]
    relabelled = DTensor.from_local(dtensor.to_local(), mesh, source, run_check=False, shape=dtensor.shape,
                                    stride=dtensor.stride())
    return relabelled.redistribute(mesh, placements)


def shards_rotated(dtensor, mesh, placements):
    """The right redistribution, then every rank's shard handed to the next rank."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    result = dtensor.redistribute(mesh, placements)
    if not any(p.is_shard() for p in placements):
        return result
    group = mesh.get_group()
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    local = result.to_local().contiguous()
    received = [None] * size
    dist.all_gather_object(received, local.cpu(), group=group)
    mine = received[(rank - 1) % size].to(local.device)
    if mine.shape != local.shape:  # uneven shards cannot be rotated in place: leave them
        return result
    return DTensor.from_local(mine, mesh, placements, run_check=False, shape=result.shape, stride=result.stride())


def replicate_claimed(dtensor, mesh, placements):
    """Redistributes to Replicate whatever was asked for."""
    from torch.distributed.tensor import Replicate

    return dtensor.redistribute(mesh, [Replicate()] * len(placements))
