"""Sub-groups: all_reduce, reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor and
all_to_all_single on groups smaller than the world, one dtype of every family, each compared with what
the group's members compute from their own inputs alone; a rank outside a group calls the same
collectives on it and must get its buffers back untouched.

At 2 ranks only groups of one exist; the 4-rank test adds groups of 2 (two disjoint pairs, the odd ranks)
and of 3. Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires, world_size
from conformance.suites import _collective_data as data
from conformance.suites import _subgroup_bodies as bodies
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]  # a group smaller than the world, and a rank outside it

DTYPES = [pytest.param(d, marks=[requires("bf16")] if d == "bfloat16" else []) for d in data.FAMILY_DTYPES]


def check_subgroup_collectives(ranks, layout: str, dtype: str, impl="torch"):
    world = ranks.world_size
    groups = bodies.layouts(world)[layout]
    salt = f"subgroups/{layout}/{dtype}"
    results = data.run_packed(ranks, bodies.subgroup_collectives_on_rank, salt, groups, dtype, impl=impl)
    problems = []
    for rank, records in enumerate(results):
        for index, (members, record) in enumerate(zip(groups, records)):
            role = "member" if rank in members else "non-member"
            for name in bodies.COLLECTIVES:
                got = record[name]
                if isinstance(got, str):
                    problems.append(f"rank {rank}: {name} on group {members} ({role}) raised {got}")
                    continue
                want = bodies.expected(bodies.salt_of(salt, index, name), members, rank, dtype, name)
                if want is not None and (problem := data.same_bits(got, want)) is not None:
                    what = "its buffer was touched" if role == "non-member" else "result"
                    problems.append(f"rank {rank}: {name} on group {members} ({role}): {what}: {problem}")
    raise_problems(problems, f"collectives on sub-groups {groups} of {world} ranks on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(bodies.layouts(2)))
def test_subgroup_collectives(ranks, layout, dtype):
    """The run's world: groups of one at 2 ranks, larger ones above."""
    check_subgroup_collectives(ranks, layout, dtype)


@world_size(4)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(bodies.layouts(4)))
def test_subgroup_collectives_4_ranks(ranks, layout, dtype):
    """Groups of 3 (all but rank 0) and of 2 (the odd ranks; two disjoint pairs)."""
    check_subgroup_collectives(ranks, layout, dtype)
