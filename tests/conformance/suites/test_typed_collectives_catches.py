"""The typed-collectives suite catches what it claims: each broken collective below fails the checks
that cover it, with a message naming the collective and the direction, and leaves the others green.

The broken implementations live in ``tests.conformance.suites._broken_collectives``; the suite's rank functions
import them on every rank by name, over the same real process group the suite uses.
"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import _typed_checks as checks
from conformance.suites import _typed_programs as programs
from conformance.suites import test_typed_collectives as suite

BROKEN = "tests.conformance.suites._broken_collectives:"


def test_all_gather_in_wrong_rank_order_fails_the_functional_forward_check(ranks):
    with pytest.raises(ConformanceFailure,
                       match=r"functional collective all_gather \(forward, float32\) on gloo is wrong:\n"
                             r"  rank 0: forward: \d+ of \d+ elements differ"):
        suite.check_functional_collective(ranks, "all_gather", "forward", "float32",
                                          impl=BROKEN + "GATHER_WRONG_ORDER")


def test_all_gather_in_wrong_rank_order_fails_typed_gather_and_fsdp(ranks):
    with pytest.raises(ConformanceFailure, match=r"typed collective all_gather\(S\(0\)->R\) .* is wrong:\n"
                                                 r"  rank 0: forward: "):
        suite.check_typed_collective(ranks, "all_gather(S(0)->R)", "float32", impl=BROKEN + "GATHER_WRONG_ORDER")
    with pytest.raises(ConformanceFailure, match=r"typed program fsdp .* is wrong:\n"
                                                 r"  rank 0: gathered weight \(R: the full weight\): "):
        suite.check_program(ranks, "fsdp", "float32", impl=BROKEN + "GATHER_WRONG_ORDER")
    # A program that never gathers is untouched by the broken all_gather.
    suite.check_program(ranks, "tp_mlp", "float32", impl=BROKEN + "GATHER_WRONG_ORDER")


def test_all_reduce_without_backward_fails_only_the_backward_check(ranks):
    impl = BROKEN + "ALL_REDUCE_NO_BACKWARD"
    suite.check_functional_collective(ranks, "all_reduce", "forward", "float32", impl=impl)
    with pytest.raises(ConformanceFailure,
                       match=r"functional collective all_reduce \(backward, float32\) on gloo is wrong:\n"
                             r"  rank 0: backward \(gradient of the input\): \d+ of \d+ elements differ"):
        suite.check_functional_collective(ranks, "all_reduce", "backward", "float32", impl=impl)


def test_all_reduce_without_backward_fails_P_to_R_but_not_P_to_I(ranks):
    """all_reduce(P -> I) has an identity backward by design, so only P -> R may notice."""
    impl = BROKEN + "ALL_REDUCE_NO_BACKWARD"
    with pytest.raises(ConformanceFailure, match=r"typed collective all_reduce\(P->R\) .* is wrong:\n"
                                                 r"  rank 0: backward \(gradient of the input\): "):
        suite.check_typed_collective(ranks, "all_reduce(P->R)", "float32", impl=impl)
    suite.check_typed_collective(ranks, "all_reduce(P->I)", "float32", impl=impl)


def test_lenient_all_gather_fails_the_rejection_check(ranks):
    with pytest.raises(ConformanceFailure, match=r"typed program all_gather_src_R over gloo must be rejected:\n"
                                                 r"  rank 0: the program ran; it must be rejected with ValueError"):
        suite.check_rejected(ranks, "all_gather_src_R", impl=BROKEN + "LENIENT_ALL_GATHER")


def test_unknown_implementation_name_is_a_clear_error(ranks):
    from conformance import RankError

    with pytest.raises(RankError, match=r"expected 'torch' or 'package.module:ATTRIBUTE'"):
        ranks.run(programs.run_raw_collective, "all_reduce", "float32", impl="no-such-thing")


# -- the comparison itself, without ranks ----------------------------------------------------------

def _check(actual, expected, **kwargs):
    import torch

    return checks.Check("grad of w", torch.tensor(actual), torch.tensor(expected), **kwargs)


def test_summed_gradients_must_add_up_to_the_reference():
    per_rank = [[_check([1.0, 2.0], [3.0, 3.0], summed_over=(0, 1))],
                [_check([2.0, 0.0], [3.0, 3.0], summed_over=(0, 1))]]
    with pytest.raises(ConformanceFailure, match=r"ranks \[0, 1\] summed: grad of w: 1 of 2 elements differ"):
        checks.verify_checks(per_rank, what="program")
    per_rank[1][0] = _check([2.0, 1.0], [3.0, 3.0], summed_over=(0, 1))
    checks.verify_checks(per_rank, what="program")


def test_a_deliberately_wrong_program_that_comes_out_right_proves_nothing():
    per_rank = [[_check([1.0], [1.0], must_differ=True)], [_check([0.5], [1.0], must_differ=True)]]
    with pytest.raises(ConformanceFailure, match=r"rank 0: grad of w: equals the reference, but this program "
                                                 r"is deliberately wrong"):
        checks.verify_checks(per_rank, what="program")


def test_bf16_tolerance_is_wider_than_float32():
    per_rank = [[_check([1.01], [1.0])]]
    checks.verify_checks(per_rank, what="program", dtype_name="bfloat16")
    with pytest.raises(ConformanceFailure, match=r"rank 0: grad of w: 1 of 1 elements differ"):
        checks.verify_checks(per_rank, what="program", dtype_name="float32")
