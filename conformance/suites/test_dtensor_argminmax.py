"""DTensor argmax/argmin against eager torch on the full tensor, on the backend's device and process group.

The matrix (``_argminmax.cases``): placements Replicate, Shard(0), Shard(1) and Partial (redistributed
by the op) on a 1-D mesh; [Shard(0),Shard(1)], [Replicate(),Shard(0)] and a tensor dim sharded on
both mesh dims on a 2 x 2 mesh (4 ranks); dim None, 0, 1, -1 with and without keepdim; random data,
ties inside one shard, ties across shards, all equal, NaN (the first NaN wins), -inf, uneven shards
(5 x 7, a 7-element vector) and a vector; float32, bfloat16, int64 and bool (eager raises for bool:
DTensor must too). A case passes when the output placements are valid for an index tensor and the
gathered result equals eager's, or when both raise.

Test ids read ``test_argmax[Shard(1)-dim=None-ties_across_shards-float32]`` (``dim=0,keepdim`` with
keepdim). Every case of a mesh is evaluated by one ranks.run (cached in this process), each id then
asserts its own record, so a few thousand cases cost seconds. ``test_compiled`` compares
torch.compile with eager on bool inputs and on ties.
"""

from __future__ import annotations

import pytest

from conformance import requires, world_size
from conformance.checks import ConformanceFailure
from conformance.suites import _argminmax as matrix

pytestmark = requires("dtensor")

_RESULTS: dict[tuple, object] = {}


def _params(mesh: str, op: str):
    return [pytest.param(case, id=case.id, marks=[requires("bf16")] if case.dtype == "bfloat16" else [])
            for case in matrix.cases(mesh) if case.op == op]


def _cached(ranks, key: tuple, fn, *args):
    """One ranks.run per key in this process; every test of the key reads (or re-raises) its outcome."""
    if key not in _RESULTS:
        try:
            _RESULTS[key] = ranks.run(fn, *args)
        except AssertionError as exc:  # RankError: the whole evaluation failed; every case says so
            _RESULTS[key] = exc
    outcome = _RESULTS[key]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _raise_problems(problems: dict[int, str], what: str) -> None:
    if not problems:
        return
    by_message: dict[str, list[int]] = {}
    for rank, message in problems.items():
        by_message.setdefault(message, []).append(rank)
    lines = [f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {m}" for m, r in by_message.items()]
    raise ConformanceFailure(f"{what}:\n  " + "\n  ".join(lines))


def check_case(ranks, case: matrix.Case, *, mesh: str = "1d", handler: str = "dtensor",
               only: tuple[str, ...] | None = None) -> None:
    """Assert one case of the matrix (evaluating the whole matrix, or the cases in ``only``, on first use)."""
    per_rank = _cached(ranks, ("matrix", mesh, handler, only, ranks.world_size), matrix.evaluate_matrix, mesh,
                       handler, only)
    key = matrix.case_key(case)
    problems = {rank: message for rank, records in enumerate(per_rank)
                if (message := matrix.verdict(case, records[key])) is not None}
    _raise_problems(problems, f"DTensor {case.op} over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) "
                              "differs from eager")


@pytest.mark.parametrize("case", _params("1d", "argmax"))
def test_argmax(ranks, case):
    check_case(ranks, case)


@pytest.mark.parametrize("case", _params("1d", "argmin"))
def test_argmin(ranks, case):
    check_case(ranks, case)


@world_size(4)
@pytest.mark.parametrize("case", _params("2d", "argmax"))
def test_argmax_2d_mesh(ranks, case):
    check_case(ranks, case, mesh="2d")


@world_size(4)
@pytest.mark.parametrize("case", _params("2d", "argmin"))
def test_argmin_2d_mesh(ranks, case):
    check_case(ranks, case, mesh="2d")


@requires("compile")
@pytest.mark.parametrize("op, dim, data", [pytest.param(*c, id=matrix.compiled_case_id(*c))
                                           for c in matrix.COMPILED_CASES])
def test_compiled(ranks, op, dim, data):
    records = _cached(ranks, ("compiled", ranks.world_size), matrix.evaluate_compiled)[0]
    case_id = matrix.compiled_case_id(op, dim, data)
    message = matrix.compiled_verdict(case_id, records[case_id])
    _raise_problems({0: message} if message else {}, f"torch.compile differs from eager on {ranks.device}")
