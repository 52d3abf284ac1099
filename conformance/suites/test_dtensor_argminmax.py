"""DTensor argmax/argmin against eager torch on the full tensor, on the backend's device and process group.

The matrix (``_argminmax.cases``): placements Replicate, Shard(0), Shard(1) and Partial (redistributed
by the op) on a 1-D mesh; [Shard(0),Shard(1)], [Replicate(),Shard(0)] and a tensor dim sharded on
both mesh dims on a 2 x 2 mesh (4 ranks); dim None, 0, 1, -1 with and without keepdim; random data,
ties inside one shard, ties across shards, all equal, NaN (the first NaN wins), -inf, uneven shards
(5 x 7, a 7-element vector) and a vector; float32, bfloat16, int64 and bool (eager raises for bool:
DTensor must too). A case passes when the output placements are valid for an index tensor and the
gathered result equals eager's, or when both raise.

Test ids read ``test_argmax[Shard(1)-dim=None-ties_across_shards-float32]`` (``dim=0,keepdim`` with
keepdim). The cases of one placement on a mesh are evaluated in batches of ``CASES_PER_EVALUATION``, one
ranks.run each (``_evaluations``: cached in this process, evaluated again, at most twice, after a rank crash
or a timeout), each id then asserts its own record, so a few thousand cases cost seconds. ``test_compiled`` compares torch.compile with eager on bool inputs and on ties.
"""

from __future__ import annotations

import functools

import pytest

from conformance import requires, world_size
from conformance.suites import _argminmax as matrix
from conformance.suites._evaluations import Evaluations, assert_verdicts, batches

pytestmark = requires("dtensor")

_EVALUATIONS = Evaluations()


def _params(mesh: str, op: str):
    return [pytest.param(case, id=case.id, marks=[requires("bf16")] if case.dtype == "bfloat16" else [])
            for case in matrix.cases(mesh) if case.op == op]


@functools.cache
def _batches_of_placement(mesh: str, placement: str) -> dict[str, tuple[str, ...]]:
    return batches([matrix.case_key(c) for c in matrix.cases(mesh) if c.placement == placement])


def check_case(ranks, case: matrix.Case, *, mesh: str = "1d", handler: str = "dtensor",
               only: tuple[str, ...] | None = None) -> None:
    """Assert one case of the matrix, evaluating on first use the cases in ``only``, or else the batch
    of the case's placement on the mesh that holds it (a rank that crashes takes only that batch's
    evaluation with it, and a mesh never mixes placements within one evaluation)."""
    if only is None:
        only = _batches_of_placement(mesh, case.placement)[matrix.case_key(case)]
    per_rank = _EVALUATIONS.records(ranks, ("matrix", mesh, handler, only), matrix.evaluate_matrix, mesh, handler,
                                    only)
    assert_verdicts(per_rank, matrix.case_key(case), lambda record: matrix.verdict(case, record),
                    f"DTensor {case.op} over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) differs from eager")


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
    per_rank = _EVALUATIONS.records(ranks, ("compiled",), matrix.evaluate_compiled)
    case_id = matrix.compiled_case_id(op, dim, data)
    assert_verdicts(per_rank[:1], case_id, lambda record: matrix.compiled_verdict(case_id, record),
                    f"torch.compile differs from eager on {ranks.device}")
