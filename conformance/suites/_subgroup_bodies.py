"""Rank functions of the ``subgroups`` suite: every collective on groups smaller than the world.

A layout is a list of groups (each a sorted list of global ranks). Every rank makes every group of
the layout (``new_group`` is collective over the world) and then, group by group, calls the same
sequence of collectives on it: a member takes part, a non-member must return at once and leave its
buffers as they were (torch.distributed's promise for a rank outside the group). The controller
compares a member's results with what the members' own inputs give, and a non-member's buffers with
what they held before.

Every function takes ``impl`` (``_collective_impls.resolve_dist``).
"""

from __future__ import annotations

from conformance.suites._collective_bodies import _error, destroy_once_connected
from conformance.suites._collective_data import packed, payload, reduce_input
from conformance.suites._collective_impls import resolve_dist

CHUNK = 17  # elements per member and collective (more than any dtype's edge values)
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single")


def layouts(world: int) -> dict[str, list[list[int]]]:
    """The layouts of groups smaller than a world of ``world`` ranks, by name: at 2 ranks only groups of
    one exist; from 3 on, groups of 2 and more."""
    if world < 2:
        return {}
    out = {"all_but_rank_0": [list(range(1, world))], "odd_ranks": [list(range(1, world, 2))]}
    half = world // 2
    out["two_halves"] = [list(range(half)), list(range(half, world))]
    return out


def salt_of(salt: str, group: int, collective: str) -> str:
    return f"{salt}/g{group}/{collective}"


def inputs(salt: str, rank: int, size: int, dtype: str, collective: str):
    """Rank ``rank``'s input to ``collective`` in a group of ``size`` (CPU)."""
    if collective in ("all_reduce", "reduce"):
        return reduce_input(salt, rank, CHUNK, dtype, "SUM")
    if collective == "reduce_scatter_tensor":
        return reduce_input(salt, rank, CHUNK * size, dtype, "SUM")
    if collective == "all_to_all_single":
        return payload(salt, rank, CHUNK * size, dtype)
    return payload(salt, rank, CHUNK, dtype)  # broadcast, all_gather_into_tensor


def output_size(size: int, collective: str) -> int | None:
    """Elements of the separate output buffer of ``collective`` (None: it works in place)."""
    return {"all_gather_into_tensor": CHUNK * size, "reduce_scatter_tensor": CHUNK,
            "all_to_all_single": CHUNK * size}.get(collective)


def untouched(salt: str, rank: int, numel: int, dtype: str):
    """What an output buffer holds before the collective (CPU)."""
    return payload(f"{salt}/before", rank, numel, dtype)


def _call(dist, name: str, group, members: list[int], data, out):
    if name == "all_reduce":
        return dist.all_reduce(data, group=group)
    if name == "reduce":
        return dist.reduce(data, dst=members[0], group=group)
    if name == "broadcast":
        return dist.broadcast(data, src=members[-1], group=group)
    if name == "all_gather_into_tensor":
        return dist.all_gather_into_tensor(out, data, group=group)
    if name == "reduce_scatter_tensor":
        return dist.reduce_scatter_tensor(out, data, group=group)
    return dist.all_to_all_single(out, data, group=group)


@packed
def subgroup_collectives_on_rank(ctx, salt: str, groups: list[list[int]], dtype: str, impl: str = "torch"):
    """``[{collective: (the buffer the result lands in, or an error)} per group of the layout]``."""
    dist = resolve_dist(impl)
    rank = ctx.rank
    made = [dist.new_group(members) for members in groups]
    results = []
    for index, (members, group) in enumerate(zip(groups, made)):
        record = {}
        for name in COLLECTIVES:
            s = salt_of(salt, index, name)
            data = inputs(s, rank, len(members), dtype, name).to(ctx.device)
            size = output_size(len(members), name)
            out = None if size is None else untouched(s, rank, size, dtype).to(ctx.device)
            try:
                _call(dist, name, group, members, data, out)
            except (RuntimeError, ValueError, TypeError) as exc:
                record[name] = _error(exc)
                continue
            record[name] = data if out is None else out
        results.append(record)
    for group in made:
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            destroy_once_connected(dist, group)
    return results


def expected(salt: str, members: list[int], rank: int, dtype: str, collective: str):
    """What ``rank``'s buffer must hold after ``collective`` on the group ``members`` (None: nothing is
    promised, a non-root's buffer after reduce), computed from the members' inputs alone (CPU)."""
    import torch

    from conformance.suites._collective_data import expected_reduction

    size = len(members)
    if rank not in members:  # a non-member's buffers stay as they were
        out_size = output_size(size, collective)
        return inputs(salt, rank, size, dtype, collective) if out_size is None else untouched(salt, rank, out_size, dtype)
    mine = members.index(rank)
    given = [inputs(salt, m, size, dtype, collective) for m in members]
    if collective == "all_reduce":
        return expected_reduction("SUM", given)
    if collective == "reduce":
        return expected_reduction("SUM", given) if mine == 0 else None
    if collective == "broadcast":
        return given[-1]
    if collective == "all_gather_into_tensor":
        return torch.cat(given)
    if collective == "reduce_scatter_tensor":
        return expected_reduction("SUM", given).split(CHUNK)[mine]
    return torch.cat([g.split(CHUNK)[mine] for g in given])  # all_to_all_single
