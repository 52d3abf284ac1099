"""The two ways ranks start (``process.default_start_method``): forked from the controller's server that has
imported torch (the default on CPU) and fresh interpreters (the default on accelerators). A forked rank is
the rank a fresh one would be: the pool's environment, the controller's working directory and import path,
the worker's argv, its own thread count, its output in its log; and its death reads the same."""

from __future__ import annotations

import os
import signal
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
