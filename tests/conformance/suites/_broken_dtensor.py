"""Deliberately broken redistributions and ops, handed to the dtensor suite by import path.

Redistributions have the signature ``(dtensor, mesh, placements) -> DTensor`` (``redistributor=``), ops
``(op, dtensor_args) -> result`` (``applier=``); the suite's rank functions import this module on every
rank (``"tests.conformance.suites._broken_dtensor:NAME"``).
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


# -- broken ops: ``(op, dtensor_args) -> result``, handed to the suite's op checks (``applier=``) -------

def matmul_partial_claimed_replicate(op, args):
    """A contraction over a sharded dim whose partial sums are labelled Replicate (never reduced)."""
    from torch.distributed.tensor import DTensor, Replicate

    from conformance.suites._dtensor_cases import default_apply_op

    result = default_apply_op(op, args)
    if op != "matmul" or not any(p.is_partial() for p in result.placements):
        return result
    return DTensor.from_local(result.to_local(), result.device_mesh, [Replicate()] * result.device_mesh.ndim,
                              run_check=False, shape=result.shape, stride=result.stride())


def softmax_over_the_local_shard(op, args):
    """Softmax normalised over each rank's own columns when the softmax dim is sharded."""
    import torch
    from torch.distributed.tensor import DTensor

    from conformance.suites._dtensor_cases import default_apply_op

    (x,) = args if op == "softmax" else (None,)
    if op != "softmax" or not any(p.is_shard(x.ndim - 1) for p in x.placements):
        return default_apply_op(op, args)
    local = torch.softmax(x.to_local(), dim=-1)
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def sum_gradient_doubled(op, args):
    """The right sum forward, a gradient twice too large backward."""
    from conformance.suites._dtensor_cases import default_apply_op

    result = default_apply_op(op, args)
    if op == "sum":
        result.register_hook(lambda grad: grad * 2)
    return result


# -- broken dropout: ``(dtensor) -> dtensor``, handed to the random-number check (``dropper=``) ------

def dropout_of_each_local_shard(x):
    """Dropout of each rank's local tensor from the shared seed: every shard gets the same mask."""
    import torch
    from torch.distributed.tensor import DTensor

    local = torch.nn.functional.dropout(x.to_local(), p=0.5)
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def dropout_seeded_by_rank(x):
    """Dropout of each local tensor from a seed offset by the rank: a replicated tensor's copies differ."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    torch.manual_seed(1234 + dist.get_rank())
    local = torch.nn.functional.dropout(x.to_local(), p=0.5)
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


# -- a broken compiler: ``(fn) -> compiled fn``, handed to the torch.compile check (``compiler=``) ----

def compiled_without_the_reduction(fn):
    """A 'compiled' program that runs ``fn`` on the local shards and calls the result replicated:
    the sum over the sharded dim is never reduced across ranks (a dropped all-reduce)."""
    from torch.distributed.tensor import DTensor, Replicate

    def run(x, w):
        local = fn(x.to_local(), w.to_local())
        return DTensor.from_local(local, x.device_mesh, [Replicate()], run_check=False)

    return run
