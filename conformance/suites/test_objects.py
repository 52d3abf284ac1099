"""Objects: ``send_object_list`` / ``recv_object_list`` between every ordered pair of ranks (the objects,
in order, and the sender ``recv_object_list`` returns), and broadcast_object_list, gather_object,
scatter_object_list, all_gather_object and send/recv_object_list on a sub-group (all ranks but 0),
rooted by group rank (``group_src`` / ``group_dst``), not by global rank.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires
from conformance.suites import _object_bodies as bodies
from conformance.suites._collective_bodies import rank_object
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]


def check_object_lists(ranks, impl="torch"):
    salt, world = "objects/p2p", ranks.world_size
    results = ranks.run(bodies.object_lists_on_rank, salt, impl=impl)
    problems = []
    for src in range(world):
        for dst in (d for d in range(world) if d != src):
            got = results[dst].get(f"{src}->{dst}")
            want = bodies.message(salt, src, dst)
            if isinstance(got, str):
                problems.append(f"rank {dst}: recv_object_list from rank {src} raised {got}")
            elif got is None or got[0] != want:
                problems.append(f"rank {dst}: recv_object_list from rank {src}: got {None if got is None else got[0]!r:.200}, "
                                f"expected {want!r:.200}")
            elif got[1] != src:
                problems.append(f"rank {dst}: recv_object_list from rank {src} returned sender {got[1]!r}")
    raise_problems(problems, f"send_object_list/recv_object_list over {ranks.backend}")


def test_send_recv_object_list(ranks):
    check_object_lists(ranks)


def _expected_on_subgroup(salt: str, members: list[int], rank: int) -> dict:
    me, root = members.index(rank), len(members) - 1
    want = {
        "broadcast_object_list": [rank_object(f"{salt}/b/{i}", members[root]) for i in range(2)],
        "gather_object": [rank_object(f"{salt}/g", m) for m in members] if me == root else None,
        "scatter_object_list": rank_object(f"{salt}/s", members[me]),
        "all_gather_object": [rank_object(f"{salt}/a", m) for m in members],
    }
    if len(members) >= 2:
        want["send_object_list/recv_object_list"] = bodies.message(salt, members[0], members[root]) if me == root else None
    return want


def check_subgroup_objects(ranks, impl="torch"):
    salt, world = "objects/subgroup", ranks.world_size
    members = bodies.subgroup_members(world)
    results = ranks.run(bodies.subgroup_objects_on_rank, salt, impl=impl)
    lacking = next((r for r in results if isinstance(r, str)), None)
    if lacking is not None:
        pytest.skip(lacking)
    problems = []
    for rank, got in enumerate(results):
        if rank not in members:
            continue
        for name, want in _expected_on_subgroup(salt, members, rank).items():
            root = members[-1]
            value = got.get(name)
            if isinstance(value, str):
                problems.append(f"rank {rank}: {name} on group {members} (root: group rank {len(members) - 1} = rank "
                                f"{root}) raised {value}")
            elif value != want:
                problems.append(f"rank {rank}: {name} on group {members} (root: group rank {len(members) - 1} = rank "
                                f"{root}): got {value!r:.200}, expected {want!r:.200}")
    raise_problems(problems, f"object collectives on a sub-group over {ranks.backend}")


def test_object_collectives_on_a_subgroup(ranks):
    check_subgroup_objects(ranks)
