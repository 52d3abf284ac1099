"""The two ways ranks start (``process.default_start_method``): forked from the controller's server that has
imported torch (the default on CPU) and fresh interpreters (the default on accelerators). A forked rank is
the rank a fresh one would be: the pool's environment, the controller's working directory and import path,
the worker's argv, its own thread count, its output in its log; and its death reads the same. The server is
a fresh interpreter or, where the controller may be copied, a fork of it that first forgets the run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from conformance.ranks import FORKSERVER, SPAWN, RankCrashed, RankPool, default_start_method

METHODS = [FORKSERVER, SPAWN]


def describe_rank(ctx):
    import torch

    print(f"rank {ctx.rank} writes to its log", flush=True)
    return {"marker": os.environ.get("CONFORMANCE_TEST_MARKER"), "threads_env": os.environ.get("OMP_NUM_THREADS"),
            "threads": torch.get_num_threads(), "cwd": os.getcwd(), "argv0": os.path.basename(sys.argv[0]),
            "argv_config_rank": __import__("json").loads(sys.argv[1])["rank"],
            "test_root_importable": any(os.path.isfile(os.path.join(p, "tests", "conformance", "rank_functions.py"))
                                        for p in sys.path), "stdin": os.read(0, 10)}


def die_by_signal(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return ctx.rank


def _pool(method: str, **kwargs) -> RankPool:
    return RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=60, grace=1.0,
                    start_method=method, **kwargs)


def test_cpu_ranks_fork_and_accelerator_ranks_start_fresh():
    assert default_start_method("cpu") == FORKSERVER
    for device_type in ("cuda", "xpu", "privateuseone"):
        assert default_start_method(device_type) == SPAWN
    assert RankPool(descriptor="gpu", device_type="cuda", backend="nccl", world_size=2).start_method == SPAWN


@pytest.mark.parametrize("method", METHODS)
def test_a_rank_has_the_setting_a_fresh_one_has_whichever_way_it_started(method, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "CONFORMANCE_TEST_MARKER": method, "OMP_NUM_THREADS": "1"}
    with _pool(method, env=env) as pool:
        described = pool.run(describe_rank)
        logs = [rank.output_tail() for rank in pool.ranks]
    for rank, seen in enumerate(described):
        assert seen == {"marker": method, "threads_env": "1", "threads": 1, "cwd": str(tmp_path),
                        "argv0": "worker.py", "argv_config_rank": rank, "test_root_importable": True,
                        "stdin": b""}
        assert f"rank {rank} writes to its log" in logs[rank]


def what_was_imported_for_me(ctx):
    imported = sys.modules.get("tests.conformance.imported_for_ranks")
    try:
        import tests.conformance.fails_to_import  # noqa: F401
        failing = "imported"
    except RuntimeError as exc:
        failing = str(exc)
    if imported is None:
        return {"imported": False, "failing": failing}
    return {"imported": True, "by_another_process": imported.IMPORTED_BY_PID != os.getpid(),
            "marker": imported.MARKER_AT_IMPORT, "failing": failing}


@pytest.mark.parametrize("method", METHODS)
def test_a_fork_server_imports_what_its_ranks_need_once_under_their_environment(method):
    """``rank_imports`` (capabilities.RANK_IMPORTS: DTensor, Dynamo) are imported by the fork server, under the
    ranks' environment, before it forks them; a fresh rank imports what it uses itself. A module that fails to
    import is left to the rank, which meets the same error."""
    env = {**os.environ, "CONFORMANCE_TEST_MARKER": f"imports-{method}"}
    imports = ("tests.conformance.imported_for_ranks", "tests.conformance.fails_to_import")
    with _pool(method, env=env, rank_imports=imports) as pool:
        seen = pool.run(what_was_imported_for_me)
    failing = "fails_to_import refuses to import"
    if method == FORKSERVER:
        assert seen == [{"imported": True, "by_another_process": True, "marker": f"imports-{method}",
                         "failing": failing}] * 2
    else:
        assert seen == [{"imported": False, "failing": failing}] * 2


@pytest.mark.parametrize("method", METHODS)
def test_a_rank_killed_by_a_signal_is_described_the_same_whichever_way_it_started(method):
    with _pool(method) as pool:
        with pytest.raises(RankCrashed, match=r"rank 1 died during die_by_signal") as crashed:
            pool.run(die_by_signal)
        assert "killed by SIGSEGV (exit code -11): Fatal Python error: Segmentation fault" in str(crashed.value)
        assert pool.run(describe_rank)[1]["argv_config_rank"] == 1  # and the pool came back


@pytest.mark.parametrize("method", METHODS)
def test_only_rank_0_of_the_first_start_probes_a_cpu_device_whichever_way_it_started(method, tmp_path):
    probe_log = tmp_path / "probes.log"
    env = {**os.environ, "CONFORMANCE_TEST_PROBE_LOG": str(probe_log)}
    with _pool(method, env=env, setup_modules=("tests.conformance.probe_log",)) as pool:
        pool.start()
        first_pids = pool.pids()
        assert pool.rank_probes["symmetric_memory"][0] is False  # rank 0's answers were read
        with pytest.raises(RankCrashed, match=r"rank 1 died during die_by_signal"):
            pool.run(die_by_signal)
        pool.start()  # respawned: the answers are already known
        assert pool.pids() != first_pids
    assert probe_log.read_text().splitlines() == [f"0 {first_pids[0]}"]


def test_every_rank_of_an_accelerator_pool_probes_as_a_symmetric_memory_allocation_can_be_collective():
    gpu = RankPool(descriptor="gpu", device_type="cuda", backend="nccl", world_size=2)
    assert [gpu.describes_device(rank) for rank in range(2)] == [True, True]
    gpu.rank_probes = {}  # as after the first start
    assert [gpu.describes_device(rank) for rank in range(2)] == [False, False]
    gpu.close()


def test_an_unknown_start_method_is_refused_naming_the_known_ones():
    with _pool("thread") as pool:
        with pytest.raises(ValueError, match=r"unknown start method 'thread': expected 'spawn' or 'forkserver'"):
            pool.run(describe_rank)


# A run whose controller is fit to be copied (a plain pytest process) forks its CPU ranks' server from itself
# (forkserver.fork_here): the module below is imported by the controller before that, under pytest's
# assertion rewriting, with pytest's capture and log handlers in place; each rank must see none of it.
FORKED_HERE_TESTS = '''
import logging
import os
import sys
import warnings
from pathlib import Path

IMPORTED_BY = os.getpid()


def _command_line(pid):
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _parent_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def seen_by_rank(ctx):
    server = os.getppid()
    return {"imported_by_this_rank": IMPORTED_BY == os.getpid(),
            "server_is_a_copy_of_the_controller": _command_line(server) == _command_line(_parent_of(server)),
            "server_parent": _parent_of(server),
            "assertions_rewritten": any(type(f).__module__.startswith("_pytest") for f in sys.meta_path),
            "plain_streams": sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__,
            "warnings_shown": type(warnings._showwarnmsg_impl).__name__ == "function",
            "pytest_log_handlers": [type(h).__name__ for h in logging.root.handlers],
            "argv0": os.path.basename(sys.argv[0])}


def fails_an_assert(ctx):
    seen = ctx.rank + 1
    assert seen == 5


def test_what_a_rank_sees(ranks):
    for seen in ranks.run(seen_by_rank):
        assert seen == {"imported_by_this_rank": True, "server_is_a_copy_of_the_controller": True,
                        "server_parent": os.getpid(), "assertions_rewritten": False, "plain_streams": True,
                        "warnings_shown": True, "pytest_log_handlers": [], "argv0": "worker.py"}


def test_an_assert_in_a_rank_reads_as_without_pytest(ranks):
    ranks.run(fails_an_assert)


def aborts_on_rank_1(ctx):
    if ctx.rank == 1:
        os.abort()
    return ctx.rank


def test_a_crash_shows_the_rank_functions_frames_not_the_controllers(ranks):
    import pytest

    from conformance.ranks import RankCrashed

    with pytest.raises(RankCrashed) as crashed:
        ranks.run(aborts_on_rank_1)
    text = str(crashed.value)
    assert "Fatal Python error: Aborted" in text and "in aborts_on_rank_1" in text, text
    assert "pluggy" not in text and "_pytest" not in text and "Extension modules" not in text, text
'''


def test_a_server_forked_from_its_controller_gives_ranks_what_a_fresh_one_would(pytester):
    pytester.makepyfile(test_forked_here=FORKED_HERE_TESTS)
    # With --backend the run's session (and its server) comes before collection: import the module first, as
    # a run without it has by then.
    pytester.makeconftest("import test_forked_here  # noqa: F401")
    result = pytester.runpytest_subprocess("--backend", "cpu", "-p", "no:cacheprovider", "-W", "always")
    result.assert_outcomes(passed=2, failed=1)
    output = result.stdout.str()
    assert "AssertionError" in output and "in fails_an_assert" in output
    assert "assert 1 == 5" not in output and "assert 2 == 5" not in output  # pytest rewrote it in the controller only


def test_only_a_process_with_torch_and_no_other_thread_is_copied_into_a_server():
    import _thread
    import threading

    import torch  # noqa: F401 - imported: only the thread is in the way

    from conformance.ranks.forkserver import unfit_to_fork

    # A thread started as pytest-xdist starts its channel's: with ``_thread``, unknown to ``threading``.
    running, stop, stopped = threading.Event(), threading.Event(), threading.Event()

    def channel():
        running.set()
        stop.wait()
        stopped.set()

    _thread.start_new_thread(channel, ())
    running.wait()
    try:
        assert re.fullmatch(r"\d+ Python threads run here", unfit_to_fork() or "")
    finally:
        stop.set()
        stopped.wait()
    fresh = subprocess.run([sys.executable, "-c", "from conformance.ranks.forkserver import unfit_to_fork; "
                            "print(unfit_to_fork())"], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "torch is not imported here (a fresh server imports it as cheaply)"
