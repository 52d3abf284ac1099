"""The DTensor suites catch what they claim: broken argmax/argmin handlers fail the cases they get
wrong, with a message giving the placement, dim, data and both answers, and pass the ones they get
right; a handler that crashes on one rank only is reported without hanging the matrix; broken
redistributions fail the dtensor suite's redistribution checks, broken ops (partial sums labelled
Replicate, a softmax over the local shard, a wrong gradient) its sharding-propagation checks, broken
dropout (one mask on every shard, replicated copies that differ) its random-number checks, and a
compiled program that drops its reduction its torch.compile check.

The broken implementations live in ``tests.conformance.suites._broken_argminmax`` and ``tests.conformance.suites._broken_dtensor``;
the suites' rank functions import them on every rank by name and run them over the same real process
group and device mesh.
"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import _argminmax as matrix
from conformance.suites import test_dtensor_argminmax as suite

BROKEN = "tests.conformance.suites._broken_argminmax:"


def _case(placement, dim, data="random", dtype="float32", op="argmax", keepdim=False):
    return matrix.Case(op, placement, dim, keepdim, data, dtype)


def _check(ranks, handler, case, *also):
    """Evaluate only ``case`` and ``also`` (not the whole matrix), then assert ``case`` like the suite does."""
    only = tuple(matrix.case_key(c) for c in (case, *also))
    suite.check_case(ranks, case, handler=BROKEN + handler, only=only)


def test_max_of_local_indices_fails_on_sharded_input(ranks):
    sharded, replicated = _case("Shard(1)", 1), _case("Replicate()", 1)
    with pytest.raises(ConformanceFailure,
                       match=r"DTensor argmax over gloo \(2 ranks, 1d mesh\) differs from eager:\n  ranks 0, 1: "
                             r"torch\.argmax\(DTensor Shard\(1\), dim=1, keepdim=False\) on random float32 data "
                             r"returned \[.*\] \(torch.int64, shape \(4,\)\), eager on the full tensor gives \["):
        _check(ranks, "max_of_local_indices", sharded, replicated)
    # On a replicated input the local index is the global one: the same handler is right there.
    _check(ranks, "max_of_local_indices", replicated, sharded)


def test_max_of_local_indices_fails_along_a_sharded_dim(ranks):
    case = _case("Shard(0)", 0, op="argmin")
    with pytest.raises(ConformanceFailure, match=r"torch\.argmin\(DTensor Shard\(0\), dim=0, keepdim=False\) on "
                                                 r"random float32 data returned \[.*\] \(torch.int64, shape \(6,\)\), "
                                                 r"eager on the full tensor gives \[.*\]"):
        _check(ranks, "max_of_local_indices", case)


def test_partial_output_placement_is_invalid_even_with_right_values(ranks):
    case = _case("Shard(0)", 1)
    with pytest.raises(ConformanceFailure, match=r"returned invalid output placements \['P\(sum\)'\] for a 1-d "
                                                 r"index tensor"):
        _check(ranks, "partial_output", case)


def test_a_crashing_case_fails_alone_and_the_group_survives(ranks):
    crashing, fine = _case("Shard(1)", 0), _case("Shard(1)", 1)
    with pytest.raises(ConformanceFailure, match=r"raised RuntimeError: deliberate crash of the handler for dim=0 "
                                                 r"\(at .*_broken_argminmax.py:\d+ in crash_on_dim_0\); "
                                                 r"eager on the full tensor gives \["):
        _check(ranks, "crash_on_dim_0", crashing, fine)
    _check(ranks, "crash_on_dim_0", fine, crashing)


def test_bool_must_raise_where_eager_raises():
    """The verdict on a record where eager refused bool input but DTensor answered."""
    import torch

    case = _case("Replicate()", 0, dtype="bool")
    record = {"eager_error": "RuntimeError: argmax(): does not support bool input",
              "placements": ["R"], "shard_dims": [None], "partial": [False], "full": torch.tensor([0, 1])}
    assert matrix.verdict(case, record) == (
        "torch.argmax(DTensor Replicate(), dim=0, keepdim=False) on random bool data returned [0, 1] "
        "(placements ['R']), but eager raises on the full tensor: RuntimeError: argmax(): does not support "
        "bool input")
    del record["full"]
    record["error"] = "RuntimeError: argmax(): does not support bool input"
    assert matrix.verdict(case, record) is None


def test_matrix_ids_read_as_documented():
    ids = {f"test_{c.op}[{c.id}]" for c in matrix.cases("1d")}
    assert "test_argmax[Shard(1)-dim=None-ties_across_shards-float32]" in ids
    assert "test_argmin[Partial(sum)-dim=0,keepdim-nan-bfloat16]" in ids
    assert not any("Shard(1)" in i and "-1d" in i for i in ids), "a 1-D tensor has no dim 1 to shard"


def test_a_case_that_raises_on_one_rank_only_fails_alone(ranks):
    """Rank 0 raises, rank 1 waits in the op's collective: the case reports the split, and the cases
    after it (on a fresh mesh) are right, instead of the whole matrix hanging."""
    crashing, before, after = _case("Shard(1)", 1), _case("Shard(0)", 0), _case("Shard(1)", -1)
    only = tuple(matrix.case_key(c) for c in (crashing, before, after))  # one evaluation serves the three checks
    handler = BROKEN + "crash_on_rank_0"
    with pytest.raises(ConformanceFailure, match=r"ranks 0, 1: torch\.argmax\(DTensor Shard\(1\), dim=1, "
                                                 r"keepdim=False\) on random float32 data: the ranks disagree "
                                                 r"\(rank 0 raised RuntimeError: deliberate crash of the handler on "
                                                 r"rank 0 only; rank 1 (raised .*|completed)\)"):
        suite.check_case(ranks, crashing, handler=handler, only=only)
    suite.check_case(ranks, before, handler=handler, only=only)
    suite.check_case(ranks, after, handler=handler, only=only)  # evaluated after the crash, on a fresh mesh


# -- the dtensor suite's redistribution checks -----------------------------------------------------

def _redistribution(source, target, shape="even"):
    from conformance.suites import _dtensor_cases as cases

    return cases.Redistribution(source, target, shape)


def _redistribute(ranks, redistributor, case):
    from conformance.suites import test_dtensor as dtensor_suite

    dtensor_suite.check_redistribute(ranks, case, redistributor=BROKEN_DTENSOR + redistributor)


BROKEN_DTENSOR = "tests.conformance.suites._broken_dtensor:"


def test_a_partial_max_read_as_a_sum_is_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"ranks 0, 1: redistribute P\(max\) -> R of a \(4, 6\) tensor: "
                                                 r"full tensor \[\[.*\]\], expected \[\["):
        _redistribute(ranks, "partial_max_as_sum", _redistribution("P(max)", "R"))
    _redistribute(ranks, "partial_max_as_sum", _redistribution("P(sum)", "R"))  # other partials untouched


def test_shards_on_the_wrong_rank_are_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"redistribute R -> S0 of a \(4, 6\) tensor: full tensor "):
        _redistribute(ranks, "shards_rotated", _redistribution("R", "S0"))
    _redistribute(ranks, "shards_rotated", _redistribution("S0", "R"))


def test_a_target_placement_ignored_is_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"redistribute S0 -> S1 of a \(5, 7\) tensor gave placements "
                                                 r"\['R'\], expected \['S\(1\)'\]"):
        _redistribute(ranks, "replicate_claimed", _redistribution("S0", "S1", "uneven"))
    _redistribute(ranks, "replicate_claimed", _redistribution("S1", "R", "uneven"))


# -- the dtensor suite's sharding-propagation (op) checks -------------------------------------------

def _op(ranks, applier, op, specs, expected):
    from conformance.suites import test_dtensor as dtensor_suite

    dtensor_suite.check_op(ranks, op, specs, expected, applier=BROKEN_DTENSOR + applier)


def test_partial_sums_labelled_replicate_are_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"ranks 0, 1: matmul on DTensor inputs placed \['S1', 'S0'\] gave "
                                                 r"output placements \['R'\], expected \['P\(sum\)'\]"):
        _op(ranks, "matmul_partial_claimed_replicate", "matmul", ("S1", "S0"), "P(sum)")
    _op(ranks, "matmul_partial_claimed_replicate", "matmul", ("S0", "R"), "S0")  # no partial: untouched


def test_a_softmax_over_the_local_shard_is_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"softmax on DTensor inputs placed \['S1'\]: output 0 is \[\[.*\]\], "
                                                 r"eager gives \[\["):
        _op(ranks, "softmax_over_the_local_shard", "softmax", ("S1",), None)
    _op(ranks, "softmax_over_the_local_shard", "softmax", ("S0",), "S0")  # the softmax dim is whole there


def test_a_wrong_gradient_is_caught(ranks):
    with pytest.raises(ConformanceFailure, match=r"sum on DTensor inputs placed \['S0'\]: gradient of operand 0 is "
                                                 r"\[\[.*\]\], eager gives \[\["):
        _op(ranks, "sum_gradient_doubled", "sum", ("S0",), "S0")
    _op(ranks, "sum_gradient_doubled", "matmul", ("S1", "S0"), "P(sum)")


# -- the dtensor suite's random-number and torch.compile checks -------------------------------------

def test_the_same_mask_on_every_shard_is_caught(ranks):
    from conformance.suites import test_dtensor as dtensor_suite

    with pytest.raises(ConformanceFailure, match=r"rank 0: dropout on a Shard\(0\) DTensor gave rank 0's shard the "
                                                 r"same mask as rank\(s\) \[1\]: one mask repeated"):
        dtensor_suite.check_dropout(ranks, "S0", dropper=BROKEN_DTENSOR + "dropout_of_each_local_shard")
    dtensor_suite.check_dropout(ranks, "R", dropper=BROKEN_DTENSOR + "dropout_of_each_local_shard")


def test_replicated_masks_that_differ_are_caught(ranks):
    from conformance.suites import test_dtensor as dtensor_suite

    with pytest.raises(ConformanceFailure, match=r"rank 0: dropout on a Replicate DTensor gave different masks on "
                                                 r"ranks \[1\] than on rank 0: the result is not replicated"):
        dtensor_suite.check_dropout(ranks, "R", dropper=BROKEN_DTENSOR + "dropout_seeded_by_rank")
    dtensor_suite.check_dropout(ranks, "S0", dropper=BROKEN_DTENSOR + "dropout_seeded_by_rank")


def test_a_compiled_program_that_drops_a_reduction_is_caught(ranks):
    from conformance.suites import test_dtensor as dtensor_suite

    with pytest.raises(ConformanceFailure, match=r"DTensor under torch.compile on \S+:\n  rank 0: compiled DTensor "
                                                 r"program gives \[.*\], eager \[.*\]\n  rank 1: "):
        dtensor_suite.check_compiled(ranks, compiler=BROKEN_DTENSOR + "compiled_without_the_reduction")
