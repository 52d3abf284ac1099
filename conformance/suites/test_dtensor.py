"""DTensor on the backend's device and process group, against eager torch on the full tensors:
redistribution between every pair of placements (1-D mesh; a lean set on a 2 x 2 mesh), sharding
propagation forward and backward, empty shards, the random-number contract and torch.compile.

The cases, their rank functions and verdicts are in ``_dtensor_cases``; one ``ranks.run`` evaluates
every case of a group (the ranks agreeing on each outcome, ``_dtensor_mesh``), each test asserts
its own record. Ids read ``test_redistribute[P(max)->S1-uneven]``, ``test_op[matmul-S1-S0]``.
"""

from __future__ import annotations

import pytest

from conformance import requires, world_size
from conformance.checks import ConformanceFailure
from conformance.suites import _dtensor_cases as cases

pytestmark = requires("dtensor")

_RESULTS: dict[tuple, object] = {}


def _records(ranks, key: tuple, fn, *args) -> list:
    """One ranks.run per key in this process; every test of the key reads (or re-raises) its outcome."""
    key = (*key, ranks.world_size)
    if key not in _RESULTS:
        try:
            _RESULTS[key] = ranks.run(fn, *args)
        except AssertionError as exc:  # RankError: the whole evaluation failed; every case says so
            _RESULTS[key] = exc
    outcome = _RESULTS[key]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _assert(per_rank: list[dict], key: str, verdict, what: str) -> None:
    problems: dict[str, list[int]] = {}
    for rank, records in enumerate(per_rank):
        if (message := verdict(records[key])) is not None:
            problems.setdefault(message, []).append(rank)
    if problems:
        lines = [f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {m}" for m, r in problems.items()]
        raise ConformanceFailure(f"{what}:\n  " + "\n  ".join(lines))


def check_redistribute(ranks, case: cases.Redistribution, mesh: str = "1d", redistributor: str = "dtensor") -> None:
    per_rank = _records(ranks, ("redistribute", mesh, redistributor), cases.evaluate_redistribute, mesh, redistributor)
    _assert(per_rank, case.id, lambda r: cases.redistribute_verdict(case, r),
            f"DTensor over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) is wrong")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases.redistributions("1d")])
def test_redistribute(ranks, case):
    check_redistribute(ranks, case)


@world_size(4)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases.redistributions("2d")])
def test_redistribute_2d_mesh(ranks, case):
    check_redistribute(ranks, case, "2d")


def check_op(ranks, op, specs, expected, mesh: str = "1d") -> None:
    per_rank = _records(ranks, ("ops", mesh), cases.evaluate_ops, mesh)
    _assert(per_rank, cases.op_case_id(op, specs), lambda r: cases.op_verdict(op, specs, expected, r),
            f"DTensor {op} over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) differs from eager")


@pytest.mark.parametrize("op, specs, expected", [pytest.param(*c, id=cases.op_case_id(*c[:2])) for c in cases.OPS_1D])
def test_op(ranks, op, specs, expected):
    check_op(ranks, op, specs, expected)


@world_size(4)
@pytest.mark.parametrize("op, specs, expected", [pytest.param(*c, id=cases.op_case_id(*c[:2])) for c in cases.OPS_2D])
def test_op_2d_mesh(ranks, op, specs, expected):
    check_op(ranks, op, specs, expected, "2d")


@pytest.mark.parametrize("spec", cases.RANDOM_CASES)
def test_dropout_mask(ranks, spec):
    per_rank = _records(ranks, ("random",), cases.evaluate_random)
    _assert(per_rank[:1], spec, lambda r: cases.random_verdict(spec, r),
            f"DTensor's random-number contract over {ranks.backend}")


@requires("compile")
def test_compiled(ranks):
    per_rank = _records(ranks, ("compiled",), cases.evaluate_compiled)
    _assert(per_rank, "matmul-relu-sum", cases.compiled_verdict, f"DTensor under torch.compile on {ranks.device}")
