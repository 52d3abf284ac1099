"""The ``init_modes`` checks catch what they claim. Eager and non-blocking init exist only on accelerators
(and NCCL), so the checks are shown on the records such ranks return: what a right backend records passes,
and a group left unbound, a split group that reduces over the whole world, and a non-blocking group whose
first collective runs before its communicator is ready each fail with the rank, the group and the
operation. On the CPU both tests skip, saying why."""

from __future__ import annotations

import torch

from conformance.suites import test_init_modes as init_modes


def _eager_records(world: int, bound=lambda rank, group: f"cuda:{rank}", split_sum=None) -> list[dict]:
    records = []
    for rank in range(world):
        half = next(h for h in init_modes.bodies.halves(world) if rank in h)
        sums = {"default": float(sum(range(1, world + 1))), "new_group": float(sum(range(1, world + 1))),
                "split_group": float(sum(m + 1 for m in half)) if split_sum is None else split_sum}
        records.append({"device": f"cuda:{rank}", "bound": {g: bound(rank, g) for g in init_modes.GROUPS},
                        "sum": {g: torch.full((2,), v) for g, v in sums.items()}})
    return records


def test_eager_init_as_a_right_backend_records_it_passes():
    assert init_modes.eager_init_problems(_eager_records(4)) == []


def test_a_new_group_left_unbound_after_eager_init():
    records = _eager_records(2, bound=lambda rank, group: "None" if group == "new_group" else f"cuda:{rank}")
    assert init_modes.eager_init_problems(records) == [
        "rank 0: the new_group group is bound to None, not to the rank's device cuda:0 "
        "(init_process_group(device_id=cuda:0))",
        "rank 1: the new_group group is bound to None, not to the rank's device cuda:1 "
        "(init_process_group(device_id=cuda:1))"]


def test_a_split_group_that_reduces_over_the_whole_world():
    problems = init_modes.eager_init_problems(_eager_records(4, split_sum=10.0))
    assert problems[0] == "rank 0: all_reduce on the split_group group of ranks [0, 1] gave [10.0, 10.0], expected [3.0, 3.0]"
    assert len(problems) == 4


def test_a_non_blocking_group_whose_first_collective_ran_before_it_was_ready():
    ready, early = torch.full((2,), 3.0), torch.full((2,), 1.0)
    assert init_modes.nonblocking_init_problems([{"sum": ready, "again": ready}] * 2) == []
    assert init_modes.nonblocking_init_problems([{"sum": early, "again": ready}, {"sum": ready, "again": ready}]) == [
        "rank 0: the first all_reduce on a non-blocking group gave [1.0, 1.0], expected [3.0, 3.0]"]


def test_on_cpu_both_skip_saying_why(pytester):
    pytester.makepyfile(test_modes="from conformance.suites.test_init_modes import *\n")
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider", "--backend", "cpu")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*eager init binds a group to an accelerator: torch refuses "
                                 "init_process_group(device_id=cpu)*",
                                 "*non-blocking communicator init is ProcessGroupNCCL's option*this backend is gloo*"])
