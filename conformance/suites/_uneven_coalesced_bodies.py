"""Rank functions of the ``uneven_coalesced`` suite: list ``all_gather`` of a different size on every
rank, and the process group's coalesced collectives called directly
(``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``; the collectives suite reaches
them only through ``_coalescing_manager``).

Each coalesced call is waited before the next is issued: two ``allgather_into_tensor_coalesced`` in
flight together corrupt gloo's heap (docs/known-bugs.md, item 18). Every function takes ``impl``
(``_collective_impls.resolve_dist``); the process group is ``dist.group.WORLD`` of that API.
"""

from __future__ import annotations

from conformance.suites._collective_bodies import _error
from conformance.suites._collective_data import packed, payload, reduce_input, unwritten
from conformance.suites._collective_impls import resolve_dist

COALESCED_SIZES = (3, 17, 1)  # elements per rank of each tensor of one coalesced call


def uneven_size(rank: int) -> int:
    return 16 + 3 * rank  # longer than any dtype's edge values, and different on every rank


@packed
def uneven_all_gather_on_rank(ctx, salt: str, dtype: str, impl: str = "torch"):
    """``[rank r's tensor of uneven_size(r) elements for every r]`` or the error."""
    dist = resolve_dist(impl)
    mine = payload(salt, ctx.rank, uneven_size(ctx.rank), dtype).to(ctx.device)
    out = [unwritten(uneven_size(r), mine.dtype, ctx.device) for r in range(ctx.world_size)]
    try:
        dist.all_gather(out, mine)
    except (RuntimeError, ValueError) as exc:
        return _error(exc)
    return out


@packed
def coalesced_direct_on_rank(ctx, salt: str, dtype: str, impl: str = "torch"):
    """``{"allgather_into_tensor_coalesced": [outputs] or error, "reduce_scatter_tensor_coalesced": ...}``."""
    dist = resolve_dist(impl)
    pg, world, rank = dist.group.WORLD, ctx.world_size, ctx.rank
    out: dict = {}
    inputs = [payload(f"{salt}/ag{i}", rank, n, dtype).to(ctx.device) for i, n in enumerate(COALESCED_SIZES)]
    outputs = [unwritten(n * world, inputs[0].dtype, ctx.device) for n in COALESCED_SIZES]
    try:
        pg.allgather_into_tensor_coalesced(outputs, inputs).wait()
        out["allgather_into_tensor_coalesced"] = outputs
    except (RuntimeError, ValueError) as exc:
        out["allgather_into_tensor_coalesced"] = _error(exc)
    fulls = [reduce_input(f"{salt}/rs{i}", rank, n * world, dtype, "SUM").to(ctx.device)
             for i, n in enumerate(COALESCED_SIZES)]
    scattered = [unwritten(n, fulls[0].dtype, ctx.device) for n in COALESCED_SIZES]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    try:
        pg.reduce_scatter_tensor_coalesced(scattered, fulls, opts).wait()
        out["reduce_scatter_tensor_coalesced"] = scattered
    except (RuntimeError, ValueError) as exc:
        out["reduce_scatter_tensor_coalesced"] = _error(exc)
    return out
