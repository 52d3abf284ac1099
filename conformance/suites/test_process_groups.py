"""Process groups: new_group, new_subgroups and split_group with collectives on the subgroup only;
a rank that skips or raises before a collective (the others get an error within the group's
timeout, and a fresh group works afterwards); monitored_barrier naming the rank that did not arrive;
work left pending when a rank never joins: ``Work.wait(timeout)`` raises by its timeout, and the group
ends (abort, shutdown, destroy_process_group) at once with that work pending; where the backend has a
NaN check (``semantics.nan_check``), a group made with it fails a collective whose input holds a NaN on
every rank, and passes finite data and NaNs in receive buffers through.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import RankCrashed, RankError, RankTimeout, requires
from conformance.suites import _collective_bodies as bodies
from conformance.suites import _collective_data as data
from conformance.suites.test_collectives import raise_problems

pytestmark = requires("collectives")

GROUP_TIMEOUT = 3.0  # seconds: the short timeout of the group a rank leaves in the lurch
CALL_LIMIT = 90.0  # a bound on the whole call, far above GROUP_TIMEOUT: hanging past it is the failure
WAIT_TIMEOUT = 2.0  # seconds: Work.wait(timeout=...) on work a rank never joins
WAIT_LIMIT = 10.0  # wait() must have raised by then: its timeout plus room for a loaded machine
PENDING_GROUP_TIMEOUT = 60.0  # the group's own timeout, far above the call: the work ends by wait's or by the ending
END_LIMIT = 10.0  # abort / shutdown / destroy_process_group with work pending must return by then


def check_subgroup(ranks, kind, impl="torch"):
    import torch

    salt = "groups"
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


ENDINGS = {"abort": "group.abort()", "shutdown": "group.shutdown()", "destroy": "destroy_process_group(group)"}


def pending_work_problems(records: list[dict], how: str, semantics, end_limit: float = END_LIMIT) -> list[str]:
    """What is wrong in ``pending_work_on_rank``'s records (the last rank's holds only ``fresh``)."""
    import torch

    world, ending, absent = len(records), ENDINGS[how], len(records) - 1
    problems = []
    for rank, record in enumerate(records[:-1]):
        wait = record.get("wait")
        if wait == "returned":
            problems.append(f"rank {rank}: work.wait(timeout={WAIT_TIMEOUT:g} s) returned although rank {absent} "
                            "never joined the all_reduce")
        elif wait is not None and record["wait_seconds"] > WAIT_LIMIT:
            problems.append(f"rank {rank}: work.wait(timeout={WAIT_TIMEOUT:g} s) raised only after "
                            f"{record['wait_seconds']:.1f} s")
        if record["end"] is not None:
            problems.append(f"rank {rank}: {ending} with an all_reduce pending raised {record['end']}")
        elif record["end_seconds"] > end_limit:
            problems.append(f"rank {rank}: {ending} with an all_reduce pending took {record['end_seconds']:.1f} s "
                            f"(bound {end_limit:g} s)")
        if semantics.ending_fails_pending_work and not record["completed_after_end"]:
            problems.append(f"rank {rank}: the pending all_reduce is not completed after {ending}, although the "
                            "descriptor declares semantics.ending_fails_pending_work")
    want = torch.full((3,), float(sum(range(1, world + 1))))
    problems += [f"rank {rank}: all_reduce on a fresh group afterwards: {problem}" for rank, record in enumerate(records)
                 if (problem := data.same_bits(record["fresh"].float(), want))]
    return problems


def check_pending_work(ranks, how, impl="torch", ender="torch", end_limit=END_LIMIT):
    """Where a timed-out collective tears the rank down (``semantics.collective_timeout: aborts_process``),
    ``wait(timeout)`` is not tried: only the ending with work pending is checked there."""
    semantics = ranks.descriptor.semantics
    wait = None if semantics.collective_timeout == "aborts_process" else WAIT_TIMEOUT
    records = ranks.run_with_timeout(CALL_LIMIT, bodies.pending_work_on_rank, how, wait, PENDING_GROUP_TIMEOUT,
                                     impl=impl, ender=ender)
    raise_problems(pending_work_problems(records, how, semantics, end_limit),
                   f"{ENDINGS[how]} with work pending that rank {ranks.world_size - 1} never joins over {ranks.backend}")


@pytest.mark.parametrize("how", list(ENDINGS))
def test_pending_work(ranks, how):
    check_pending_work(ranks, how)


def check_nan_check(ranks, case, impl="torch", nan_check=None):
    """``case`` of ``bodies.nan_check_on_rank`` on a group made with the descriptor's ``semantics.nan_check``
    variable (``nan_check``: another variable, for the stand-ins' tests). ``input`` must fail on every rank
    (an error, or the rank torn down by a device-side assert; the pool then replaces the group or the
    ranks); the other cases must pass, with the data right."""
    import torch

    descriptor = ranks.descriptor
    env_var = nan_check or descriptor.semantics.nan_check
    if env_var is None:
        pytest.skip(f"{descriptor.name} declares no NaN check (semantics.nan_check is unset in {descriptor.source}): "
                    "nothing to check collectives' inputs with")
    world, declared = ranks.world_size, f"{descriptor.name} declares semantics.nan_check: {env_var}"
    if case == "input":
        what = f"an all_gather_into_tensor with a NaN in every rank's input, on a group made with {env_var}=1, " \
               f"over {ranks.backend}"
        try:
            ranks.run_with_timeout(CALL_LIMIT, bodies.nan_check_on_rank, env_var, case, impl=impl)
        except RankError as exc:  # RankCrashed is one: a rank torn down by the check's device-side assert
            failed = set(exc.failed_ranks)
        else:
            failed = set()
        raise_problems([f"rank {rank}: did not fail (it completed, or waited for its peers) although {declared}"
                        for rank in range(world) if rank not in failed], what)
        return
    what = {"clean": f"broadcast, all_reduce and all_gather_into_tensor of finite data on a group made with "
                     f"{env_var}=1 over {ranks.backend}",
            "receive_buffer": f"a broadcast and a recv into buffers holding a NaN, on a group made with {env_var}=1, "
                              f"over {ranks.backend}"}[case]
    why = {"clean": "finite data must pass a NaN check", "receive_buffer": "a NaN check reads only what a rank sends"}
    try:
        results = ranks.run_with_timeout(CALL_LIMIT, bodies.nan_check_on_rank, env_var, case, impl=impl)
    except RankError as exc:
        raise_problems([f"rank {e.rank}: raised {e.exc_type}: {(e.message.strip().splitlines() or [''])[0]} "
                        f"({why[case]})" for e in exc.errors] or [f"{exc.summary} ({why[case]})"], what)
        return
    problems = []
    for rank, result in enumerate(results):
        if case == "clean":
            x, reduced, gathered = result
            wants = (("broadcast", x, torch.zeros(10)), ("all_reduce", reduced, torch.full((3, 4), float(world))),
                     ("all_gather_into_tensor", gathered, torch.arange(world, dtype=torch.float32).repeat_interleave(4)))
        else:
            sent, received = result
            wants = (("broadcast", sent, torch.ones(3, 4)),) + \
                ((("recv", received, torch.ones(3, 4)),) if rank == 1 else ())
        problems += [f"rank {rank}: {op}: {problem}" for op, got, want in wants
                     if (problem := data.same_bits(got, want)) is not None]
    raise_problems(problems, what)


@pytest.mark.parametrize("case", bodies.NAN_CHECK_CASES)
def test_nan_check(ranks, case):
    check_nan_check(ranks, case)
