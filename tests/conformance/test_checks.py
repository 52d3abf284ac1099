"""The assertions suites use: what counts as equal, and what the failure message says."""

from __future__ import annotations

import pytest
import torch

from conformance.checks import ConformanceFailure, assert_close, assert_ranks_equal


def test_tolerance_for_floats_and_exact_on_request():
    nudged = torch.tensor([2.0, 1.0 + 1e-7])  # one float32 step above 1.0
    assert_close(nudged, torch.tensor([2.0, 1.0]), what="sum")
    with pytest.raises(ConformanceFailure) as info:
        assert_close(nudged, torch.tensor([2.0, 1.0]), what="sum", rank=1, exact=True)
    assert str(info.value) == ("rank 1: sum is wrong: 1 of 2 elements differ, first at index (1,): "
                               "got 1.0000001192092896, expected 1.0; got [2.0, 1.0000001192092896], expected [2.0, 1.0]")


def test_exact_treats_nan_as_equal_and_inf_as_inf():
    nan, inf = float("nan"), float("inf")
    assert_close(torch.tensor([nan, inf]), torch.tensor([nan, inf]), what="x", exact=True)
    largest = torch.finfo(torch.float32).max
    with pytest.raises(ConformanceFailure, match=r"x is wrong: 1 of 1 elements differ, first at index \(0,\): "
                                                 r"got inf, expected 3.40"):
        assert_close(torch.tensor([inf]), torch.tensor([largest]), what="x", exact=True)
    with pytest.raises(ConformanceFailure, match="1 of 2 elements differ, first at index \\(1,\\): got nan"):
        assert_close(torch.tensor([1.0, nan]), torch.tensor([1.0, 1.0]), what="x")


def test_message_names_the_first_difference_and_elides_long_tensors():
    with pytest.raises(ConformanceFailure) as info:
        expected = torch.arange(12).reshape(3, 4)
        expected[1, 2] = 0
        assert_close(torch.arange(12).reshape(3, 4), expected, what="gather")
    assert str(info.value) == ("gather is wrong: 1 of 12 elements differ, first at index (1, 2): got 6, expected 0; "
                               "got [0, 1, 2, 3, 4, 5, 6, 7]..., expected [0, 1, 2, 3, 4, 5, 0, 7]...")
    with pytest.raises(ConformanceFailure, match=r"^s is wrong: 1 of 1 elements differ, first at index \(\): got 1\.0"):
        assert_close(torch.tensor(1.0), torch.tensor(2.0), what="s")


def test_shape_and_dtype_are_compared_first():
    with pytest.raises(ConformanceFailure, match=r"x is wrong: shape \(2,\), expected \(3,\)"):
        assert_close(torch.zeros(2), torch.zeros(3), what="x")
    with pytest.raises(ConformanceFailure, match="x is wrong: dtype torch.float32, expected torch.float64"):
        assert_close(torch.zeros(2), torch.zeros(2, dtype=torch.float64), what="x")


def test_ranks_equal_lists_every_wrong_rank():
    results = [torch.tensor([1]), torch.tensor([2]), torch.tensor([3])]
    assert_ranks_equal(results, [torch.tensor([1]), torch.tensor([2]), torch.tensor([3])], what="rank id")
    with pytest.raises(ConformanceFailure) as info:
        assert_ranks_equal(results, torch.tensor([2]), what="broadcast")
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 2"]
    with pytest.raises(ConformanceFailure, match="broadcast: 3 rank results but 2 expected values"):
        assert_ranks_equal(results, [torch.tensor([1])] * 2, what="broadcast")
