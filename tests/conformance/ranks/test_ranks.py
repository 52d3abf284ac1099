"""The persistent rank pool: results, remote errors, and recovery from hangs, crashes and broken groups."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conformance.ranks import RankCrashed, RankError, RankPool, RankTimeout
from tests.conformance import rank_functions as fns


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _wait_gone(pids, seconds=15.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture(scope="module")
def pool():
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2,
                  timeout=30, grace=1.0) as p:
        yield p


def test_results_come_back_in_rank_order(pool):
    results = pool.run(fns.rank_and_sum, 10)
    assert [r[:5] for r in results] == [(0, 2, "cpu", "gloo", 21), (1, 2, "cpu", "gloo", 21)]
    assert len({r[5] for r in results}) == 2  # two distinct processes


def test_pool_is_persistent_between_calls(pool):
    first = [r[5] for r in pool.run(fns.rank_and_sum, 0)]
    second = [r[5] for r in pool.run(fns.rank_and_sum, 0)]
    assert first == second == pool.pids()


def test_shared_dir_is_shared(pool):
    assert pool.run(fns.shared_dir_roundtrip) == [["r0", "r1"], ["r0", "r1"]]


def test_remote_exception_carries_every_failing_rank_traceback(pool):
    pool.start()  # the pids compared below are those of running ranks, whichever test ran first
    pids = pool.pids()
    with pytest.raises(RankError) as info:
        pool.run(fns.raise_on_ranks, [0, 1])
    err = info.value
    assert type(err) is RankError
    assert err.failed_ranks == [0, 1]
    assert [e.exc_type for e in err.errors] == ["ValueError", "ValueError"]
    text = str(err)
    assert "raise_on_ranks raised on rank 0, 1" in text
    assert "deliberate failure on rank 0" in text and "deliberate failure on rank 1" in text
    assert 'rank_functions.py", line' in text  # the remote traceback, not just the message
    # Same processes, fresh process group, next call works.
    assert pool.pids() == pids
    assert pool.events[-1] == "process group replaced after raise_on_ranks raised"
    assert pool.run(fns.rank_and_sum, 1)[0][4] == 3


def test_error_while_peer_waits_in_collective_respawns(pool):
    old = pool.pids()
    with pytest.raises(RankError) as info:
        pool.run(fns.raise_before_collective)
    assert info.value.failed_ranks == [0]
    assert "rank 1 did not finish within 1 s after that (likely blocked in a collective)" in str(info.value)
    # where rank 1 was stuck, read from it before it was killed: the collective, under the test's function
    assert list(info.value.stacks) == [1]
    assert re.search(r'rank_functions.py", line \d+ in raise_before_collective', info.value.stacks[1])
    assert "--- rank 1 did not answer; its threads were at:" in str(info.value)
    assert _wait_gone(old) == []
    assert pool.run(fns.rank_and_sum, 0)[0][4] == 1
    assert set(pool.pids()).isdisjoint(old)


def test_hang_times_out_names_ranks_and_recovers(pool):
    old = pool.pids()
    started = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        pool.run_with_timeout(2, fns.sleep_forever)
    assert time.monotonic() - started < 10
    assert "sleep_forever timed out after 2 s; no answer from rank 0, 1" in str(info.value)
    assert sorted(info.value.stacks) == [0, 1]  # each hung rank's stacks, read before the pool was respawned
    for rank, stack in info.value.stacks.items():
        assert re.search(r'rank_functions.py", line \d+ in sleep_forever', stack), (rank, stack)
        assert "forkserver.py" not in stack and "runpy" not in stack  # how the rank was started is left out
    assert _wait_gone(old) == []
    assert pool.run(fns.rank_and_sum, 0)[0][4] == 1


@pytest.mark.parametrize("how, expected", [
    ("exit", "exited with code 7"),
    ("segfault", "killed by SIGSEGV (exit code -11)"),
])
def test_crashed_rank_is_named_and_pool_recovers(pool, how, expected):
    old = pool.pids()
    with pytest.raises(RankCrashed) as info:
        if how == "exit":
            pool.run(fns.exit_hard, 1, 7)
        else:
            pool.run(fns.segfault, 1)
    assert info.value.failed_ranks == [1]
    assert f"rank 1 died during {'exit_hard' if how == 'exit' else 'segfault'}" in str(info.value)
    assert expected in str(info.value)
    assert _wait_gone(old) == []
    assert pool.run(fns.rank_and_sum, 0)[0][4] == 1


def test_crash_report_includes_the_rank_output(pool):
    with pytest.raises(RankCrashed) as info:
        pool.run(fns.print_then_crash)
    assert "last words of rank 1" in str(info.value)
    assert "SIGSEGV" in str(info.value)
    assert pool.run(fns.rank_and_sum, 0)[0][4] == 1


def test_a_crashed_rank_is_described_by_its_fatal_error_even_under_a_deep_stack(pool):
    with pytest.raises(RankCrashed) as info:
        pool.run(fns.abort_deep_in_a_stack, 1)
    (error,) = info.value.errors
    assert error.message == ("killed by SIGABRT (exit code -6): malloc(): pretend heap corruption detected / "
                             "Fatal Python error: Aborted")
    assert "abort_deep_in_a_stack" in error.traceback  # the tail still shows the stack


def test_a_rank_stuck_after_a_fatal_error_is_a_crash_not_a_hang(pool):
    old = pool.pids()
    with pytest.raises(RankCrashed) as info:
        pool.run(fns.fatal_then_hang)
    assert "rank 1 died during fatal_then_hang" in info.value.summary
    gone = [e for e in info.value.errors if e.exc_type == "RankGone"]
    assert [(e.rank, e.message) for e in gone] == [
        (1, "stopped answering after Fatal Python error: Segmentation fault")]
    assert _wait_gone(old) == []
    assert pool.run(fns.rank_and_sum, 0)[0][4] == 1


def test_only_module_level_functions(pool):
    def local(ctx):
        return 1

    with pytest.raises(TypeError, match="needs a module-level function"):
        pool.run(local)


def test_start_failure_is_reported_with_the_traceback():
    with RankPool(descriptor="broken", device_type="cpu", backend="gloo", world_size=2,
                  setup_modules=("no_such_module_for_conformance",), startup_timeout=60) as pool:
        with pytest.raises(RankCrashed) as info:
            pool.run(fns.rank_and_sum, 0)
    assert "the pool could not start" in str(info.value)
    assert "No module named 'no_such_module_for_conformance'" in str(info.value)


def test_a_start_failure_on_one_rank_is_reported_without_waiting_out_the_start_up_timeout():
    # Rank 0 waits for rank 1 at the rendezvous until the start-up timeout (600 s here); the controller
    # must report rank 1's failure a grace after it, not wait that long for rank 0 as well.
    env = {**os.environ, "CONFORMANCE_TEST_FAILING_RANK": "1"}
    started = time.monotonic()
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, env=env, grace=1.0,
                  setup_modules=("tests.conformance.failing_rank",), startup_timeout=600) as pool:
        with pytest.raises(RankCrashed) as info:
            pool.run(fns.rank_and_sum, 0)
    waited = time.monotonic() - started
    assert info.value.summary.endswith("the pool could not start: start-up failed on rank 1; rank 0 had not "
                                       "started 1 s after that (waiting for its peers)"), info.value.summary
    assert [e.rank for e in info.value.errors] == [1]
    assert "this rank's setup failed on purpose" in str(info.value)
    assert waited < 300, f"waited {waited:.0f} s: the start-up timeout, not the grace after rank 1 failed"


def test_start_up_that_never_answers_times_out_naming_the_ranks():
    with RankPool(descriptor="slow", device_type="cpu", backend="gloo", world_size=2,
                  setup_modules=("tests.conformance.slow_setup",), startup_timeout=2) as pool:
        with pytest.raises(RankTimeout) as info:
            pool.run(fns.rank_and_sum, 0)
        assert pool.events == ["pool respawned: start-up timed out after 2 s"]
        assert not pool.started
    assert "slow pool (2 ranks, gloo): start-up timed out after 2 s; no answer from rank 0, 1" in str(info.value)
    # each rank's stacks show where its start-up was: importing the setup module
    assert sorted(info.value.stacks) == [0, 1]
    assert all(re.search(r'slow_setup.py", line \d+ in <module>', stack) for stack in info.value.stacks.values())


def test_a_rank_that_starts_later_than_the_call_timeout_still_joins_its_group():
    """Forming the group waits for late peers up to the start-up timeout, not the call timeout (1 s here)."""
    env = {**os.environ, "CONFORMANCE_TEST_LATE_RANK": "1", "CONFORMANCE_TEST_LATE_SECONDS": "4"}
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=1, startup_timeout=60,
                  setup_modules=("tests.conformance.late_rank",), env=env) as pool:
        assert [r[4] for r in pool.run(fns.rank_and_sum, 1)] == [3, 3]
        assert pool.events == []


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_close_leaves_no_processes(method):
    pool = RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, start_method=method)
    pool.run(fns.rank_and_sum, 0)
    pids = pool.pids()
    pool.close()
    assert _wait_gone(pids) == []
    assert not pool.workdir.exists()


@pytest.mark.parametrize("method, server", [("forkserver", "fresh"), ("forkserver", "forked here"),
                                            ("spawn", None)])
def test_ranks_die_with_a_killed_controller(tmp_path, method, server):
    """kill -9 of the controller (no cleanup code runs) still takes its ranks down (forked ranks: with the
    fork server, which dies with the controller, whether it started fresh or as a copy of the controller)."""
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from conformance.ranks import RankPool, forkserver
        from tests.conformance import rank_functions as fns
        {"import torch; assert forkserver.fork_here()" if server == "forked here" else ""}
        pool = RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, start_method={method!r})
        pool.run(fns.rank_and_sum, 0)
        print(json.dumps(pool.pids()), flush=True)
        time.sleep(600)
    """)
    # A controller killed with SIGKILL cleans nothing up: its pool's directory goes to this test's tmp_path.
    controller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        pids = json.loads(controller.stdout.readline())
        assert all(_alive(p) for p in pids)
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait()
    assert _wait_gone(pids) == []


def test_custom_registered_backend_runs(tmp_path):
    """An out-of-tree distributed backend registered by a setup module is used by every rank."""
    with RankPool(descriptor="oot", device_type="cpu", backend="conformance_loopback",
                  world_size=2, setup_modules=("tests.conformance.oot_backend",)) as pool:
        results = pool.run(fns.rank_and_sum, 5)
    assert [r[3] for r in results] == ["conformance_loopback"] * 2
    assert [r[4] for r in results] == [11, 11]


def test_a_reply_the_controller_cannot_unpickle_is_that_ranks_error_and_the_next_call_gets_fresh_replies(pool):
    with pytest.raises(RankError, match=r"unreadable_on raised on rank 1\n--- rank 1: UnreadableReply: its reply "
                                        r"\(\d+ bytes\) could not be unpickled here: ZeroDivisionError: division by zero"):
        pool.run(fns.unreadable_on, 1)
    # Rank 0's answer to that call was read with it, not left for the next call to take as its own.
    assert pool.run(fns.unreadable_on, -1) == [("fresh", 0), ("fresh", 1)]
    assert not [e for e in pool.events if e.startswith("dropped a late")]


def test_a_late_reply_to_an_earlier_call_is_dropped_not_taken_for_the_answer(pool):
    earlier = pool.calls
    assert pool.run(fns.send_a_late_reply, earlier) == [("fresh", 0), ("fresh", 1)]
    assert pool.events[-1] == f"dropped a late result reply of rank 0 to call {earlier}"
    assert pool.run(fns.rank_and_sum, 0)[0][:2] == (0, 2)  # nothing left over for the next call either
