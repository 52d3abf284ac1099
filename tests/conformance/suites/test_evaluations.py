"""A rank that dies while a group of DTensor cases is evaluated: the group is evaluated again on fresh
ranks, every test of the group warns with the crash, and a group that crashes every time fails with it.

Real ranks over gloo; the rank functions crash by SIGSEGV (as the DTensor crash in docs/known-bugs.md
does) on the first N calls, counted in a file every rank of every generation sees.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conformance.ranks import RankCrashed, RankPool
from conformance.suites import _evaluations
from conformance.suites._evaluations import Evaluations, RankCrashWarning


def crash_first_calls(ctx, counter: str, crashes: int) -> dict:
    """Rank 1 dies by SIGSEGV on the first ``crashes`` calls; then every rank returns its record."""
    path = Path(counter)
    if ctx.rank == 1:
        calls = int(path.read_text()) if path.exists() else 0
        path.write_text(str(calls + 1))
        if calls < crashes:
            os.kill(os.getpid(), signal.SIGSEGV)
    return {"case": {"rank": ctx.rank}}


def hang_first_call(ctx, counter: str) -> dict:
    """Rank 1 never answers the first call (as a rank spinning on a corrupted heap would)."""
    path = Path(counter)
    if ctx.rank == 1 and not path.exists():
        path.write_text("1")
        time.sleep(3600)
    return {"case": {"rank": ctx.rank}}


def abort_first_call_deep_in_a_stack(ctx, counter: str, depth: int = 40) -> dict:
    """As glibc does on heap corruption: rank 1 prints a line and aborts, here under ``depth`` frames
    (faulthandler's stack is then longer than the output a crash report keeps), on the first call."""
    if depth:
        return abort_first_call_deep_in_a_stack(ctx, counter, depth - 1)
    path = Path(counter)
    if ctx.rank == 1 and not path.exists():
        path.write_text("1")
        print("malloc(): pretend heap corruption detected", flush=True)
        os.abort()
    return {"case": {"rank": ctx.rank}}


@pytest.fixture(scope="module")
def pool():
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=60, grace=2.0) as p:
        yield p


def test_a_crash_is_evaluated_again_and_every_test_of_the_group_warns(pool, tmp_path):
    evaluations, counter = Evaluations(), str(tmp_path / "calls")
    for _ in range(2):  # two tests of the group: both warn, the group is evaluated once more only
        with pytest.warns(RankCrashWarning, match=r"crash_first_calls was evaluated again on fresh ranks after 1 "
                                                  r"crash\(es\) or timeout\(s\): cpu pool \(2 ranks, gloo\): "
                                                  r"rank 1 died during "
                                                  r"crash_first_calls; rank 1 killed by SIGSEGV \(exit code -11\): "
                                                  r"Fatal Python error: Segmentation fault"):
            per_rank = evaluations.records(pool, ("group",), crash_first_calls, counter, 1)
        assert per_rank == [{"case": {"rank": 0}}, {"case": {"rank": 1}}]
    assert Path(counter).read_text() == "2"


def test_a_group_that_crashes_every_time_fails_with_the_last_crash(pool, tmp_path):
    evaluations, counter = Evaluations(), str(tmp_path / "calls")
    attempts = _evaluations.EVALUATIONS_AFTER_A_CRASH + 1
    with pytest.warns(RankCrashWarning, match=rf"crash_first_calls crashed or timed out every time after {attempts} "
                                              r"crash\(es\) or timeout\(s\)"):
        with pytest.raises(RankCrashed, match=r"rank 1 died during crash_first_calls"):
            evaluations.records(pool, ("group",), crash_first_calls, counter, attempts)
    assert Path(counter).read_text() == str(attempts)
    # The pool works afterwards, and the outcome is kept: the group is not evaluated a fourth time.
    with pytest.warns(RankCrashWarning), pytest.raises(RankCrashed):
        evaluations.records(pool, ("group",), crash_first_calls, counter, attempts)
    assert Path(counter).read_text() == str(attempts)
    assert Evaluations().records(pool, ("other",), crash_first_calls, counter, 0) == [{"case": {"rank": 0}},
                                                                                      {"case": {"rank": 1}}]


def test_the_warning_names_the_fatal_error_even_under_a_deep_stack(pool, tmp_path):
    with pytest.warns(RankCrashWarning, match=r"rank 1 killed by SIGABRT \(exit code -6\): malloc\(\): pretend heap "
                                              r"corruption detected / Fatal Python error: Aborted$"):
        per_rank = Evaluations().records(pool, ("deep",), abort_first_call_deep_in_a_stack, str(tmp_path / "calls"))
    assert per_rank == [{"case": {"rank": 0}}, {"case": {"rank": 1}}]


def test_a_timed_out_evaluation_is_evaluated_again_with_a_warning(tmp_path):
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=3, grace=1.0) as quick:
        with pytest.warns(RankCrashWarning, match=r"hang_first_call was evaluated again on fresh ranks after 1 "
                                                  r"crash\(es\) or timeout\(s\): cpu pool \(2 ranks, gloo\): "
                                                  r"hang_first_call timed out "
                                                  r"after 3 s; no answer from rank 1"):
            per_rank = Evaluations().records(quick, ("hang",), hang_first_call, str(tmp_path / "calls"))
    assert per_rank == [{"case": {"rank": 0}}, {"case": {"rank": 1}}]


def test_batches_cut_the_keys_in_order_and_every_key_finds_its_own():
    keys = [f"case{i}" for i in range(7)]
    by_key = _evaluations.batches(keys, size=3)
    assert list(by_key) == keys
    assert sorted(set(by_key.values())) == [("case0", "case1", "case2"), ("case3", "case4", "case5"), ("case6",)]
    assert all(key in batch for key, batch in by_key.items())


def test_the_argminmax_suite_evaluates_a_placement_in_batches_that_never_mix_placements():
    from conformance.suites import _argminmax as matrix
    from conformance.suites import test_dtensor_argminmax as suite

    for mesh in ("1d", "2d"):
        for case in matrix.cases(mesh)[::97]:
            batch = suite._batches_of_placement(mesh, case.placement)[matrix.case_key(case)]
            assert matrix.case_key(case) in batch and 1 <= len(batch) <= _evaluations.CASES_PER_EVALUATION
            placements = {c.placement for c in matrix.cases(mesh) if matrix.case_key(c) in batch}
            assert placements == {case.placement}
