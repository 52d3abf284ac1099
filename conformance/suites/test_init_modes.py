"""Init modes: eager init with a ``device_id`` binds the default group, and the groups made from it
(``new_group``, ``split_group``), to the rank's device, and their collectives are right; a group whose NCCL
communicator is created non-blocking is right from its first collective.

Eager init binds only accelerators (torch refuses ``device_id`` on the CPU), and non-blocking init is
``ProcessGroupNCCL``'s option: elsewhere these tests skip, saying so. The checks are plain functions of
the ranks' records (``eager_init_problems``, ``nonblocking_init_problems``), so the project's tests show on
the CPU what each catches.
"""

from __future__ import annotations

import pytest

from conformance import requires
from conformance.suites import _init_mode_bodies as bodies
from conformance.suites.test_collectives import raise_problems

pytestmark = requires("collectives")

GROUPS = ("default", "new_group", "split_group")


def _sum_problem(got, members: list[int]) -> str | None:
    import torch

    want = torch.full((2,), float(sum(m + 1 for m in members)))
    return None if torch.equal(got, want) else f"gave {got.tolist()}, expected {want.tolist()}"


def eager_init_problems(records: list[dict]) -> list[str]:
    world = len(records)
    problems = []
    for rank, record in enumerate(records):
        members = {"default": list(range(world)), "new_group": list(range(world)),
                   "split_group": next(h for h in bodies.halves(world) if rank in h)}
        for group in GROUPS:
            if record["bound"][group] != record["device"]:
                problems.append(f"rank {rank}: the {group} group is bound to {record['bound'][group]}, not to the "
                                f"rank's device {record['device']} (init_process_group(device_id={record['device']}))")
            if (problem := _sum_problem(record["sum"][group], members[group])) is not None:
                problems.append(f"rank {rank}: all_reduce on the {group} group of ranks {members[group]} {problem}")
    return problems


def nonblocking_init_problems(records: list[dict]) -> list[str]:
    members = list(range(len(records)))
    return [f"rank {rank}: the {which} all_reduce on a non-blocking group {problem}"
            for rank, record in enumerate(records) for which, key in (("first", "sum"), ("second", "again"))
            if (problem := _sum_problem(record[key], members)) is not None]


def check_eager_init(ranks, impl="torch"):
    if ranks.descriptor.device_type == "cpu":
        pytest.skip("eager init binds a group to an accelerator: torch refuses init_process_group(device_id=cpu) "
                    "('device_id parameter must be an accelerator with an index'), so cpu ranks start unbound")
    raise_problems(eager_init_problems(ranks.run(bodies.eager_init_on_rank, impl=impl)),
                   f"eager init (device_id) over {ranks.backend}")


def check_nonblocking_init(ranks, impl="torch"):
    if ranks.backend != "nccl":
        pytest.skip(f"non-blocking communicator init is ProcessGroupNCCL's option (config.blocking = 0); this "
                    f"backend is {ranks.backend}")
    raise_problems(nonblocking_init_problems(ranks.run(bodies.nonblocking_init_on_rank, impl=impl)),
                   f"non-blocking init over {ranks.backend}")


def test_eager_init_binds_groups_to_the_rank_device(ranks):
    check_eager_init(ranks)


def test_nonblocking_init(ranks):
    check_nonblocking_init(ranks)
