"""Under torchrun every launcher process is one rank of the launcher's world: two torchrun "nodes" on
127.0.0.1 (static and c10d rendezvous) run real suites, a 2 x 2 world has intra- and inter-node groups,
and a rank that dies or hangs fails its test while the run goes on and ends leaving no process behind."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from conformance.report import validate_report
from tests.conformance.tagged_processes import processes_tagged

pytestmark = pytest.mark.slow
TORCHRUN = shutil.which("torchrun") or f"{sys.executable} -m torch.distributed.run"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(tmp_path, args: list[str], *, nproc: int = 1, rdzv: str = "static", timeout: float = 900):
    """Start two torchrun "nodes" on 127.0.0.1 and wait for both: [(returncode, output)] by node rank."""
    port, tag = _free_port(), uuid.uuid4().hex
    env = {**os.environ, "CONFORMANCE_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
    procs = []
    for node in range(2):
        rendezvous = (["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
                      if rdzv == "static" else
                      ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag])
        cmd = TORCHRUN.split() + ["--nnodes", "2", "--nproc-per-node", str(nproc), *rendezvous, *args]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert processes_tagged(tag) == [], "a rank or launcher process outlived the run"
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def _report(tmp_path):
    return validate_report(json.loads((tmp_path / "r.json").read_text()))


def test_two_static_nodes_run_collectives_and_dtensor_green(tmp_path):
    selection = ("(test_all_reduce and (SUM or MAX) and (float32 or int64)) or test_all_gather or test_barrier "
                 "or test_object_collectives or (test_argmax and Shard and random and float32)")
    (rc0, out0), (rc1, out1) = launch_nodes(tmp_path, ["-m", "conformance", "run", "--suite", "collectives",
                                                       "--suite", "dtensor_argminmax", "--report", "r.json",
                                                       "--", "-k", selection])
    assert (rc0, rc1) == (0, 0), out0[-3000:] + out1[-3000:]
    report = _report(tmp_path)
    assert report.backend.world_size == 2 and report.summary.failed == 0 and report.summary.errors == 0
    suites = report.suites()
    assert suites["collectives"].passed >= 10 and suites["dtensor_argminmax"].passed >= 5
    for test in report.tests:  # one report, every rank's outcome and node
        assert [(r.rank, r.node.split(" (")[0]) for r in test.ranks] == [(0, "node 0"), (1, "node 1")], test
    assert "conformance on cpu (gloo, 2 ranks" in out0 and "conformance on cpu" not in out1


MESH_TESTS = '''
import torch
import torch.distributed as dist

from conformance import world_size


def groups_on_rank(ctx):
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][ctx.rank // 2]   # rows of the 2 x 2 mesh
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][ctx.rank % 2]    # columns
    out = {}
    for name, group in (("tp", tp), ("dp", dp)):
        nodes = [None] * 2
        dist.all_gather_object(nodes, ctx.node, group=group)
        total = torch.tensor([ctx.rank], device=ctx.device)
        dist.all_reduce(total, group=group)
        out[name] = (nodes, int(total))
    return ctx.node, out


@world_size(4)
def test_mesh_rows_are_intra_node_and_columns_inter_node(ranks):
    results = ranks.run(groups_on_rank)
    for rank, (node, out) in enumerate(results):
        tp_nodes, tp_sum = out["tp"]
        dp_nodes, dp_sum = out["dp"]
        assert tp_nodes == [node, node] and tp_sum == (1 if rank < 2 else 5)
        assert len(set(dp_nodes)) == 2 and dp_sum == (2 if rank % 2 == 0 else 4)
    assert len({node for node, _ in results}) == 2
'''


def test_two_by_two_c10d_world_has_intra_and_inter_node_groups(tmp_path):
    (tmp_path / "test_mesh.py").write_text(MESH_TESTS)
    (rc0, out0), (rc1, out1) = launch_nodes(tmp_path, ["-m", "pytest", "test_mesh.py", "--backend", "cpu",
                                                       "--conformance-report", "r.json", "-p", "no:cacheprovider"],
                                            nproc=2, rdzv="c10d")
    assert (rc0, rc1) == (0, 0), out0[-3000:] + out1[-3000:]
    report = _report(tmp_path)
    assert report.summary.passed == 1 and report.backend.world_size == 4
    assert [r.node.split(" (")[0] for r in report.tests[0].ranks] == ["node 0", "node 0", "node 1", "node 1"]


FAULT_TESTS = '''
import os
import signal
import time

import torch
import torch.distributed as dist


def die_on_rank_1(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def hang_on_rank_1(ctx):
    if ctx.rank == 1:
        time.sleep(600)
    return ctx.rank


def total(ctx):
    t = torch.tensor([ctx.rank + 1], device=ctx.device)
    dist.all_reduce(t)
    return int(t)


def test_1_rank_killed(ranks):
    ranks.run(die_on_rank_1)


def test_2_after_the_kill(ranks):
    assert ranks.run(total) == [3, 3]


def test_3_rank_hangs(ranks):
    ranks.run(hang_on_rank_1)


def test_4_after_the_hang(ranks):
    assert ranks.run(total) == [3, 3]
'''


def test_a_killed_or_hung_rank_fails_its_test_and_the_run_ends_cleanly(tmp_path):
    (tmp_path / "test_faults.py").write_text(FAULT_TESTS)
    (rc0, out0), (rc1, out1) = launch_nodes(tmp_path, ["-m", "pytest", "test_faults.py", "--backend", "cpu",
                                                       "--rank-timeout", "10", "--conformance-report", "r.json",
                                                       "-p", "no:cacheprovider"], timeout=600)
    assert (rc0, rc1) == (1, 1), out0[-3000:] + out1[-3000:]  # both saw the same two failures
    by_name = {t.nodeid.rsplit("::", 1)[1]: t for t in _report(tmp_path).tests}
    killed, hung = by_name["test_1_rank_killed"], by_name["test_3_rank_hangs"]
    assert killed.outcome == "failed" and "rank 1 died during die_on_rank_1" in killed.message, killed
    assert "killed by SIGKILL" in killed.message and "node 1" in killed.message
    assert hung.outcome == "failed" and "hang_on_rank_1 timed out after 10 s; no answer from rank 1" in hung.message
    assert [r.outcome for r in killed.ranks] == ["failed", "failed"]
    assert by_name["test_2_after_the_kill"].outcome == "passed" and by_name["test_4_after_the_hang"].outcome == "passed"
