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
from conformance.suites import _dtensor_cases as cases
from conformance.suites._evaluations import Evaluations, assert_verdicts

pytestmark = requires("dtensor")

_EVALUATIONS = Evaluations()


def check_redistribute(ranks, case: cases.Redistribution, mesh: str = "1d", redistributor: str = "dtensor") -> None:
    per_rank = _EVALUATIONS.records(ranks, ("redistribute", mesh, redistributor), cases.evaluate_redistribute,
                                    mesh, redistributor)
    assert_verdicts(per_rank, case.id, lambda r: cases.redistribute_verdict(case, r),
                    f"DTensor over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) is wrong")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases.redistributions("1d")])
def test_redistribute(ranks, case):
    check_redistribute(ranks, case)


@world_size(4)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases.redistributions("2d")])
def test_redistribute_2d_mesh(ranks, case):
    check_redistribute(ranks, case, "2d")


def check_op(ranks, op, specs, expected, mesh: str = "1d", applier: str = "dtensor") -> None:
    per_rank = _EVALUATIONS.records(ranks, ("ops", mesh, applier), cases.evaluate_ops, mesh, applier)
    assert_verdicts(per_rank, cases.op_case_id(op, specs), lambda r: cases.op_verdict(op, specs, expected, r),
                    f"DTensor {op} over {ranks.backend} ({ranks.world_size} ranks, {mesh} mesh) differs from eager")


@pytest.mark.parametrize("op, specs, expected", [pytest.param(*c, id=cases.op_case_id(*c[:2])) for c in cases.OPS_1D])
def test_op(ranks, op, specs, expected):
    check_op(ranks, op, specs, expected)


@world_size(4)
@pytest.mark.parametrize("op, specs, expected", [pytest.param(*c, id=cases.op_case_id(*c[:2])) for c in cases.OPS_2D])
def test_op_2d_mesh(ranks, op, specs, expected):
    check_op(ranks, op, specs, expected, "2d")


def check_dropout(ranks, spec: str, dropper: str = "dtensor") -> None:
    per_rank = _EVALUATIONS.records(ranks, ("random", dropper), cases.evaluate_random, dropper)
    assert_verdicts(per_rank[:1], spec, lambda r: cases.random_verdict(spec, r),
                    f"DTensor's random-number contract over {ranks.backend}")


@pytest.mark.parametrize("spec", cases.RANDOM_CASES)
def test_dropout_mask(ranks, spec):
    check_dropout(ranks, spec)


def check_compiled(ranks, compiler: str = "dtensor") -> None:
    per_rank = _EVALUATIONS.records(ranks, ("compiled", compiler), cases.evaluate_compiled, compiler)
    assert_verdicts(per_rank, "matmul-relu-sum", cases.compiled_verdict,
                    f"DTensor under torch.compile on {ranks.device}")


@requires("compile")
def test_compiled(ranks):
    check_compiled(ranks)
