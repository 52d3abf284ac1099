"""Rank functions of the ``objects`` suite: ``send_object_list`` / ``recv_object_list`` between every
ordered pair of ranks, and the object collectives on a sub-group, rooted by group rank
(``group_src`` / ``group_dst``).

Every function takes ``impl`` (``_collective_impls.resolve_dist``); objects come from
``_collective_bodies.rank_object`` (a different size on every rank).
"""

from __future__ import annotations

import inspect

from conformance.suites._collective_bodies import _error, destroy_once_connected, rank_object
from conformance.suites._collective_impls import resolve_dist

OBJECTS_PER_MESSAGE = 3


def message(salt: str, src: int, dst: int) -> list:
    return [rank_object(f"{salt}/{src}->{dst}/{i}", src + i) for i in range(OBJECTS_PER_MESSAGE)]


def subgroup_members(world: int) -> list[int]:
    """A group smaller than the world whose group ranks differ from its global ranks: all but rank 0."""
    return list(range(1, world))


def missing_api(dist) -> str | None:
    """What this torch lacks for the sub-group checks (rooted by group rank), or None."""
    import torch

    for name, arg in (("broadcast_object_list", "group_src"), ("gather_object", "group_dst"),
                      ("scatter_object_list", "group_src"), ("send_object_list", "group_dst"),
                      ("recv_object_list", "group_src")):
        if arg not in inspect.signature(getattr(dist, name)).parameters:
            return f"torch {torch.__version__} has no {name}({arg}=...)"
    return None


def object_lists_on_rank(ctx, salt: str, impl: str = "torch") -> dict:
    """For each ordered pair in turn, src sends ``message`` and dst receives it:
    ``{"src->dst": (the objects received, the sender recv_object_list named)}`` on dst."""
    dist = resolve_dist(impl)
    world, rank, got = ctx.world_size, ctx.rank, {}
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue
            try:
                if rank == src:
                    dist.send_object_list(message(salt, src, dst), dst=dst, device=ctx.device)
                elif rank == dst:
                    received = [None] * OBJECTS_PER_MESSAGE
                    sender = dist.recv_object_list(received, src=src, device=ctx.device)
                    got[f"{src}->{dst}"] = (received, sender)
            except (RuntimeError, ValueError, TypeError) as exc:
                got[f"{src}->{dst}"] = _error(exc)
    return got


def subgroup_objects_on_rank(ctx, salt: str, impl: str = "torch") -> dict | str | None:
    """On the group ``subgroup_members``, rooted at its last group rank: broadcast_object_list,
    gather_object, scatter_object_list and all_gather_object, then (with 2+ members) send/recv_object_list
    from group rank 0 to the last by group rank. ``{operation: result or error}``; None outside the
    group; a string when this torch lacks the API."""
    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    if (lacking := missing_api(dist)) is not None:
        return lacking
    members = subgroup_members(world)
    group = dist.new_group(members)
    if rank not in members:
        return None
    me, root = members.index(rank), len(members) - 1
    out: dict = {}

    def attempt(name, fn):
        try:
            out[name] = fn()
        except (RuntimeError, ValueError, TypeError) as exc:
            out[name] = _error(exc)

    def broadcast():
        objects = [rank_object(f"{salt}/b/{i}", rank) for i in range(2)] if me == root else [None, None]
        dist.broadcast_object_list(objects, group=group, group_src=root, device=ctx.device)
        return objects

    def gather():
        listed = [None] * len(members) if me == root else None
        dist.gather_object(rank_object(f"{salt}/g", rank), listed, group=group, group_dst=root)
        return listed

    def scatter():
        received = [None]
        given = [rank_object(f"{salt}/s", m) for m in members] if me == root else None
        dist.scatter_object_list(received, given, group=group, group_src=root)
        return received[0]

    def all_gather():
        listed = [None] * len(members)
        dist.all_gather_object(listed, rank_object(f"{salt}/a", rank), group=group)
        return listed

    def point_to_point():
        if me == 0:
            dist.send_object_list(message(salt, rank, members[root]), group=group, group_dst=root, device=ctx.device)
            return None
        if me == root:
            received = [None] * OBJECTS_PER_MESSAGE
            dist.recv_object_list(received, group=group, group_src=0, device=ctx.device)
            return received
        return None

    for name, fn in (("broadcast_object_list", broadcast), ("gather_object", gather),
                     ("scatter_object_list", scatter), ("all_gather_object", all_gather)):
        attempt(name, fn)
    if len(members) >= 2:
        attempt("send_object_list/recv_object_list", point_to_point)
    destroy_once_connected(dist, group)
    return out
