"""Rank functions of the ``init_modes`` suite: what eager init (``device_id``) binds, split groups of a bound
group, and groups made with NCCL's non-blocking communicator init.

Every function takes ``impl`` (``_collective_impls.resolve_dist``) and returns plain values and CPU tensors.
"""

from __future__ import annotations

from conformance.suites._collective_impls import resolve_dist


def halves(world: int) -> list[list[int]]:
    """The ranks split in two (a group of one each at 2 ranks; one group at 1 rank)."""
    return [h for h in (list(range(world // 2)), list(range(world // 2, world))) if h]


def _sum_over(dist, group, ctx):
    import torch

    value = torch.full((2,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(value, group=group)
    return value.cpu()


def eager_init_on_rank(ctx, impl: str = "torch"):
    """The pool's ranks start with ``init_process_group(device_id=<the rank's device>)`` on accelerators:
    ``{"device", "bound": {group: str(bound_device_id)}, "sum": {group: all_reduce of rank + 1}}`` for the
    default group, a ``new_group`` of every rank and this rank's half from ``split_group``."""
    dist = resolve_dist(impl)
    made = {"new_group": dist.new_group(), "split_group": dist.split_group(split_ranks=halves(ctx.world_size))}
    record = {"device": str(ctx.device), "bound": {"default": str(getattr(dist.group.WORLD, "bound_device_id", None))},
              "sum": {"default": _sum_over(dist, dist.group.WORLD, ctx)}}
    for name, group in made.items():
        record["bound"][name] = str(getattr(group, "bound_device_id", None))
        record["sum"][name] = _sum_over(dist, group, ctx)
    for group in made.values():
        dist.destroy_process_group(group)
    return record


def nonblocking_init_on_rank(ctx, impl: str = "torch"):
    """A ``new_group`` whose NCCL communicator is created non-blocking (``config.blocking = 0``), used at
    once: ``{"sum": all_reduce of rank + 1, "again": the same a second time}``."""
    dist = resolve_dist(impl)
    options = dist.ProcessGroupNCCL.Options()
    options.config.blocking = 0
    group = dist.new_group(pg_options=options)
    record = {"sum": _sum_over(dist, group, ctx), "again": _sum_over(dist, group, ctx)}
    dist.destroy_process_group(group)
    return record
