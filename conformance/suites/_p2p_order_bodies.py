"""Rank functions of the ``p2p_ordering`` suite: several messages between one pair of ranks, in one
``batch_isend_irecv`` and across batches, and the calls ``batch_isend_irecv`` must refuse.

Every function takes ``impl`` (``_collective_impls.resolve_dist``). Inputs come from
``_collective_data.payload``; what each receive must hold is computed on the controller from the same
salts (``message_salt``).
"""

from __future__ import annotations

from conformance.suites._collective_bodies import _error, destroy_once_connected
from conformance.suites._collective_data import packed, payload
from conformance.suites._collective_impls import resolve_dist

# The messages each rank sends to each neighbour per batch, in posting order: (numel, dtype). The first
# two are alike, so a swap of them shows in the data rather than as a size mismatch (and longer than the
# edge values that lead every payload, which are the same whatever the salt); the others mix a
# one-element message, a large one (past any eager-send threshold) and other dtypes.
MESSAGES = ((29, "float32"), (29, "float32"), (1, "int64"), (70001, "float32"), (33, "uint8"), (5, "float64"))
DIRECTIONS = ("to next", "to previous")
TAGGED_NUMEL = 16  # the tagged messages: more elements than the edge values that lead every payload


def message_salt(salt: str, batch: int, direction: str, index: int) -> str:
    return f"{salt}/{batch}/{direction}/{index}"


def peers(rank: int, world: int) -> dict[str, int]:
    """Where this rank sends in each direction (at world size 2 both are the other rank)."""
    return {"to next": (rank + 1) % world, "to previous": (rank - 1) % world}


@packed
def batches_in_order_on_rank(ctx, salt: str, batches: int, impl: str = "torch"):
    """``batches`` calls of batch_isend_irecv, none waited before the last is posted: in each, every
    MESSAGES to both neighbours, all with tag 0, and the receives of as many from both, posted in the
    order their sender posted them. ``{(batch, direction, index): received tensor}`` (direction: the
    sender's) or ``{"error": what raised}``."""
    import torch

    dist = resolve_dist(impl)
    rank, world = ctx.rank, ctx.world_size
    sends_to = peers(rank, world)
    receives_from = {"to next": (rank - 1) % world, "to previous": (rank + 1) % world}
    received, works = {}, []
    try:
        for batch in range(batches):
            ops = []
            for direction in DIRECTIONS:
                for index, (numel, dtype) in enumerate(MESSAGES):
                    data = payload(message_salt(salt, batch, direction, index), rank, numel, dtype).to(ctx.device)
                    ops.append(dist.P2POp(dist.isend, data, sends_to[direction]))
            for direction in DIRECTIONS:
                for index, (numel, dtype) in enumerate(MESSAGES):
                    buf = torch.zeros(numel, dtype=getattr(torch, dtype), device=ctx.device)
                    received[(batch, direction, index)] = buf
                    ops.append(dist.P2POp(dist.irecv, buf, receives_from[direction]))
            works += dist.batch_isend_irecv(ops)
        for work in works:
            work.wait()
    except (RuntimeError, ValueError) as exc:
        return {"error": _error(exc)}
    return received


@packed
def tags_against_order_on_rank(ctx, salt: str, impl: str = "torch"):
    """One batch: send A (tag 1) then B (tag 2) to the next rank; receive from the previous one into a
    buffer posted first with tag 2, then one with tag 1. ``{"first": ..., "second": ...}`` (the
    buffers in posting order) or ``{"error": ...}``."""
    import torch

    dist = resolve_dist(impl)
    rank, world = ctx.rank, ctx.world_size
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    first = torch.zeros(TAGGED_NUMEL, dtype=torch.int64, device=ctx.device)
    second = torch.zeros(TAGGED_NUMEL, dtype=torch.int64, device=ctx.device)
    ops = [dist.P2POp(dist.isend, payload(f"{salt}/A", rank, TAGGED_NUMEL, "int64").to(ctx.device), nxt, tag=1),
           dist.P2POp(dist.isend, payload(f"{salt}/B", rank, TAGGED_NUMEL, "int64").to(ctx.device), nxt, tag=2),
           dist.P2POp(dist.irecv, first, prev, tag=2), dist.P2POp(dist.irecv, second, prev, tag=1)]
    try:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    except (RuntimeError, ValueError) as exc:
        return {"error": _error(exc)}
    return {"first": first, "second": second}


# Calls batch_isend_irecv must refuse before it sends anything: (what, the error type it must raise,
# words its message must hold). (A peer outside the group is not among them: over gloo, torch 2.13, that
# send neither raises nor completes.)
REFUSALS = (
    ("a list holding a tensor, not a P2POp", "ValueError", "P2POp"),
    ("a P2POp whose op is all_reduce", "ValueError", "isend"),
    ("P2POps of two different groups", "ValueError", "same group"),
)


def batch_refusals_on_rank(ctx, impl: str = "torch") -> dict[str, str | None]:
    """``{what: the error raised, or None when the call went through}`` for each of REFUSALS."""
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    other = dist.new_group(list(range(world)))  # every rank makes it, in the same order
    tensor = torch.zeros(3, device=ctx.device)
    peer, prev = (rank + 1) % world, (rank - 1) % world
    attempts = {
        REFUSALS[0][0]: lambda: dist.batch_isend_irecv([tensor]),
        REFUSALS[1][0]: lambda: dist.batch_isend_irecv([dist.P2POp(dist.all_reduce, tensor, peer)]),
        # Matched within each group, so that a backend that lets it through still completes it.
        REFUSALS[2][0]: lambda: dist.batch_isend_irecv([
            dist.P2POp(dist.isend, tensor, peer), dist.P2POp(dist.irecv, tensor.clone(), prev),
            dist.P2POp(dist.isend, tensor, peer, group=other), dist.P2POp(dist.irecv, tensor.clone(), prev, group=other)]),
    }
    outcome: dict[str, str | None] = {}
    for what, attempt in attempts.items():
        try:
            works = attempt()
        except Exception as exc:  # noqa: BLE001 - the type is part of the verdict
            outcome[what] = _error(exc)
        else:
            outcome[what] = None
            for work in works or ():
                work.wait()
    destroy_once_connected(dist, other)
    return outcome
