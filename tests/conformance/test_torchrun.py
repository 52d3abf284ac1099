"""Under torchrun every launcher process is one rank of the launcher's world: two torchrun "nodes" on
127.0.0.1 (static and c10d rendezvous) run real suites, the documented one-host commands run 8 ranks, and a
2 x 2 world has intra- and inter-node groups. (How a run ends after failures, kills, hangs and a lost
launcher process: test_torchrun_run_end.py.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conformance.tagged_processes import processes_tagged
from tests.conformance.torchrun_launch import TORCHRUN, free_port, launch_nodes, report_in

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "running-at-scale.md"


def doc_commands(section: str) -> list[str]:
    """The commands in the bash blocks of one section of docs/running-at-scale.md (continuations joined,
    comments dropped)."""
    part = DOCS.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", part, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = "" if line.startswith("#") else line.split("  #", 1)[0].strip()
            if line:
                commands.append(" ".join(line.split()))
    return commands


def as_run_here(command: str, substitutions: dict[str, str] = {}) -> list[str]:
    """A documented command as this machine runs it: ``torchrun`` and ``conformance`` from this Python."""
    for old, new in substitutions.items():
        command = command.replace(old, new)
    argv = shlex.split(command)
    head = {"torchrun": TORCHRUN.split(), "conformance": [sys.executable, "-m", "conformance"]}[argv[0]]
    return head + argv[1:]


def test_the_documented_two_host_commands_run_green_with_a_shared_dir(tmp_path):
    """docs' static two-host commands, with 127.0.0.1 for host A and one process per "host": every
    "host" has its own TMPDIR, so test_barrier's files meet only in --shared-dir."""
    host_a, host_b = doc_commands("Two hosts (static rendezvous)")[:2]
    assert "--node-rank 0" in host_a and "--node-rank 1" in host_b and "--shared-dir /shared/conformance" in host_a
    port, tag = free_port(), uuid.uuid4().hex
    selection = ("(test_all_reduce and (SUM or MAX) and (float32 or int64)) or test_all_gather or test_barrier "
                 "or test_object_collectives or (test_argmax and Shard and random and float32)")
    substitutions = {"10.0.0.1": "127.0.0.1", "29500": str(port), "--nproc-per-node 8": "--nproc-per-node 1",
                     "/shared/conformance": str(tmp_path / "shared"), "report.json": "r.json"}
    env = {**os.environ, "CONFORMANCE_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
    procs = []
    for node, command in enumerate((host_a, host_b)):
        (tmp_path / f"tmp-node{node}").mkdir()
        argv = as_run_here(command, substitutions) + ["--suite", "collectives", "--suite", "dtensor_argminmax",
                                                      "--", "-k", selection]
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env={**env, "TMPDIR": str(tmp_path / f"tmp-node{node}")},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        (out0, out1) = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert processes_tagged(tag) == [], "a rank or launcher process outlived the run"
    assert [p.returncode for p in procs] == [0, 0], out0[-3000:] + out1[-3000:]
    report = report_in(tmp_path)
    assert report.backend.world_size == 2 and report.summary.failed == 0 and report.summary.errors == 0
    suites = report.suites()
    assert suites["collectives"].passed >= 10 and suites["dtensor_argminmax"].passed >= 5
    assert [t.outcome for t in report.tests if t.nodeid.endswith("::test_barrier")] == ["passed"]
    for test in report.tests:  # one report, every rank's outcome and node
        assert [(r.rank, r.node.split(" (")[0]) for r in test.ranks] == [(0, "node 0"), (1, "node 1")], test
    assert "conformance on cpu (gloo, 2 ranks" in out0 and "conformance on cpu" not in out1
    assert list((tmp_path / "shared").iterdir()) == []


ONE_HOST_SELECTION = "test_barrier or (test_all_reduce and SUM and float32 and not nonfinite)"


@pytest.mark.parametrize("command", doc_commands("One host, 8 GPUs"))
def test_the_documented_one_host_commands_run_8_ranks_here(tmp_path, command):
    """docs' two ways to run 8 ranks on one host (here: 8 CPU ranks), on a few collectives."""
    tag = uuid.uuid4().hex
    argv = as_run_here(command) + ["--suite", "collectives", "--report", "r.json", "--", "-k", ONE_HOST_SELECTION]
    done = subprocess.run(argv, cwd=tmp_path, env={**os.environ, "CONFORMANCE_TEST_TAG": tag}, capture_output=True,
                          text=True, timeout=900)
    assert processes_tagged(tag) == [], "a rank or launcher process outlived the run"
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = report_in(tmp_path)
    assert report.backend.world_size == 8 and report.summary.failed == 0 and report.summary.errors == 0
    assert report.summary.passed >= 2 and "test_barrier" in " ".join(t.nodeid for t in report.tests)
    assert "conformance on cpu (gloo, 8 ranks" in done.stdout


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
    report = report_in(tmp_path)
    assert report.summary.passed == 1 and report.backend.world_size == 4
    assert [r.node.split(" (")[0] for r in report.tests[0].ranks] == ["node 0", "node 0", "node 1", "node 1"]
