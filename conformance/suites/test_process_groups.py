"""Process groups: new_group, new_subgroups and split_group with collectives on the subgroup only;
a rank that skips or raises before a collective (the others get an error within the group's
timeout, and a fresh group works afterwards); monitored_barrier naming the rank that did not arrive.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import RankCrashed, RankTimeout, requires
from conformance.suites import _collective_bodies as bodies
from conformance.suites import _collective_data as data
from conformance.suites.test_collectives import raise_problems

pytestmark = requires("collectives")

GROUP_TIMEOUT = 3.0  # seconds: the short timeout of the group a rank leaves in the lurch
CALL_LIMIT = 90.0  # a bound on the whole call, far above GROUP_TIMEOUT: hanging past it is the failure


def check_subgroup(ranks, kind, impl="torch"):
    import torch

    salt, world = "groups", ranks.world_size
    results = data.run_packed(ranks, bodies.subgroups_on_rank, salt, kind, impl=impl)
    problems = []
    for rank, outcome in enumerate(results):
        if outcome is None:
            continue  # not a member
        if isinstance(outcome, str):
            problems.append(f"rank {rank}: {kind} raised {outcome}")
            continue
        members, reduced, gathered = outcome
        want_sum = data.expected_reduction("SUM", [data.reduce_input(f"{salt}/{kind}", m, 5, "int64", "SUM")
                                                   for m in members])
        want_gather = torch.cat([data.payload(f"{salt}/{kind}", m, 4, "int64") for m in members])
        for what, got, want in (("all_reduce", reduced, want_sum), ("all_gather", gathered, want_gather)):
            if (problem := data.same_bits(got, want)) is not None:
                problems.append(f"rank {rank}: {what} on its {kind} of ranks {members}: {problem}")
    raise_problems(problems, f"collectives on a {kind} over {ranks.backend}")


@pytest.mark.parametrize("kind", ["new_group", "new_subgroups", "split_group"])
def test_subgroup(ranks, kind):
    check_subgroup(ranks, kind)


def check_missing_rank(ranks, how, impl="torch"):
    import torch

    world = ranks.world_size
    if how != "monitored_barrier" and ranks.descriptor.semantics.collective_timeout == "aborts_process":
        check_missing_rank_torn_down(ranks, how, impl)
        return
    records = ranks.run_with_timeout(CALL_LIMIT, bodies.missing_rank_on_rank, how, GROUP_TIMEOUT, impl=impl)
    problems = []
    for rank, record in enumerate(records[:-1]):
        if record["error"] is None:
            problems.append(f"rank {rank}: completed although rank {world - 1} never joined")
        elif how == "monitored_barrier" and rank == 0 and f"Rank {world - 1}" not in record["error"]:
            problems.append(f"rank 0: the error does not name the missing rank {world - 1}: {record['error']}")
    want = torch.full((3,), float(sum(range(1, world + 1))))
    problems += [f"rank {rank}: all_reduce on a fresh group afterwards: {problem}" for rank, record in enumerate(records)
                 if (problem := data.same_bits(record["fresh"].float(), want))]
    what = {"skip": "an all_reduce the last rank skips", "raise": "an all_reduce the last rank raises before",
            "monitored_barrier": "a monitored_barrier the last rank skips"}[how]
    raise_problems(problems, f"{what} over {ranks.backend}")


def check_missing_rank_torn_down(ranks, how, impl="torch"):
    """Where a timed-out collective is ended by the backend's watchdog tearing the rank down (NCCL:
    ``semantics.collective_timeout: aborts_process``), not by an exception on the host: every rank left
    waiting must be torn down within the call's bound (the pool then replaces them)."""
    world, backend = ranks.world_size, ranks.descriptor.name
    waiting = list(range(world - 1))
    try:
        records = ranks.run_with_timeout(CALL_LIMIT, bodies.missing_rank_on_rank, how, GROUP_TIMEOUT, impl=impl)
    except RankCrashed as exc:
        if missing := [r for r in waiting if r not in exc.failed_ranks]:
            raise AssertionError(f"{backend} declares semantics.collective_timeout: aborts_process, but rank "
                                 f"{', '.join(map(str, missing))} was not torn down: {exc.summary}") from None
        return
    except RankTimeout as exc:
        raise AssertionError(f"{backend} declares semantics.collective_timeout: aborts_process, but the waiting "
                             f"ranks hung past {CALL_LIMIT:g} s instead: {exc.summary}") from None
    raised = [f"rank {r}: {record['error']}" for r, record in enumerate(records[:-1]) if record["error"]]
    raise AssertionError(f"{backend} declares semantics.collective_timeout: aborts_process, but the ranks left "
                         f"waiting were not torn down: they " + ("raised on the host: " + "; ".join(raised)
                                                                 if raised else "completed"))


@pytest.mark.parametrize("how", ["skip", "raise", "monitored_barrier"])
def test_missing_rank(ranks, how):
    check_missing_rank(ranks, how)
