"""Under torchrun every launcher process is one rank of the launcher's world: two torchrun "nodes" on
127.0.0.1 (static and c10d rendezvous) run real suites, a 2 x 2 world has intra- and inter-node groups,
and, on one node of 2 processes and on 2 static nodes of 2: a failing test, a rank that dies or hangs
fail their test while the run goes on, rank 0's report and exit code carry every rank's outcome, a lost
launcher process is named in the report, and nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conformance.report import validate_report
from tests.conformance.tagged_processes import processes_tagged

pytestmark = pytest.mark.slow
TORCHRUN = shutil.which("torchrun") or f"{sys.executable} -m torch.distributed.run"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, args: list[str], *, nodes: int = 2, nproc: int = 1, rdzv: str = "static",
           node_env: list[dict] | None = None, timeout: float = 900):
    """Start torchrun on 127.0.0.1 (one ``--standalone`` node, or ``nodes`` "nodes" with a static or c10d
    rendezvous, each with its ``node_env``) and wait for every node: [(returncode, output)] by node rank."""
    port, tag = _free_port(), uuid.uuid4().hex
    env = {**os.environ, "CONFORMANCE_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
    procs = []
    for node in range(nodes):
        if nodes == 1:
            rendezvous = ["--standalone"]
        elif rdzv == "static":
            rendezvous = ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                          "--master-port", str(port)]
        else:
            rendezvous = ["--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", tag]
        cmd = TORCHRUN.split() + [*rendezvous, "--nproc-per-node", str(nproc), *args]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env={**env, **(node_env or [{}] * nodes)[node]},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert processes_tagged(tag) == [], "a rank or launcher process outlived the run"
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def launch_nodes(tmp_path, args: list[str], *, nproc: int = 1, rdzv: str = "static", timeout: float = 900):
    """Two torchrun "nodes" on 127.0.0.1: [(returncode, output)] by node rank."""
    return launch(tmp_path, args, nodes=2, nproc=nproc, rdzv=rdzv, timeout=timeout)


def _report(tmp_path):
    return validate_report(json.loads((tmp_path / "r.json").read_text()))


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
    port, tag = _free_port(), uuid.uuid4().hex
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
    report = _report(tmp_path)
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
    report = _report(tmp_path)
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
    report = _report(tmp_path)
    assert report.summary.passed == 1 and report.backend.world_size == 4
    assert [r.node.split(" (")[0] for r in report.tests[0].ranks] == ["node 0", "node 0", "node 1", "node 1"]


RUN_END_TESTS = '''
import atexit
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from conformance import shared_dir

LAST = int(os.environ["WORLD_SIZE"]) - 1


def _leave_slowly():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as late in an interpreter's end, when Python's handlers are gone
    time.sleep(3)


if int(os.environ["RANK"]) == LAST:
    atexit.register(_leave_slowly)  # rank 0, exiting 1, must not leave (and have torchrun stop this one) first


def total(ctx):
    t = torch.tensor([ctx.rank + 1], device=ctx.device)
    dist.all_reduce(t)
    return int(t)


def die_on_last(ctx):
    if ctx.rank == LAST:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def hang_on_last(ctx):
    if ctx.rank == LAST:
        time.sleep(600)
    return ctx.rank


def server_and_launcher(ctx):
    """The command lines of this rank's parent (its server) and grandparent (its launcher process)."""
    server = os.getppid()
    launcher = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in (server, launcher)]


def read_rank_0s_file(ctx):
    path = Path(ctx.shared_dir) / "from-rank-0"
    if ctx.rank == 0:
        path.write_text("rank 0 was here")
    dist.barrier()
    return path.read_text() if path.exists() else None


def test_1_fails_on_the_last_launcher_only(ranks):
    ranks.run(total)
    assert int(os.environ["RANK"]) != LAST, "failed on the last launcher process"


def test_2_rank_killed(ranks):
    ranks.run(die_on_last)


def test_3_after_the_kill(ranks):
    assert ranks.run(total) == [sum(range(1, LAST + 2))] * (LAST + 1)
    # Respawned on CPU: forked by each launcher process's server, itself a copy of that launcher process.
    for server, launcher in ranks.run(server_and_launcher):
        assert server == launcher and b"pytest" in server, (server, launcher)


def test_4_rank_hangs(ranks):
    ranks.run(hang_on_last)


def test_5_after_the_hang(ranks):
    assert ranks.run(total) == [sum(range(1, LAST + 2))] * (LAST + 1)


@shared_dir
def test_6_every_rank_reads_rank_0s_file(ranks):
    assert ranks.run(read_rank_0s_file) == ["rank 0 was here"] * (LAST + 1)


def test_7_launcher_lost(ranks):
    ranks.run(total)  # the world is up: its peers wait for the lost process one call long, not a start-up long
    if int(os.environ["RANK"]) == LAST:
        os.kill(os.getpid(), signal.SIGKILL)  # the launcher process itself: torchrun tears down its node
    ranks.run(total)
'''
# torchrun's summary when only rank 0 exited non-zero (every other launcher process waited for it, then left 0)
ONLY_RANK_0_FAILED = re.compile(r"<NO_OTHER_FAILURES>.*rank\s*:\s*0 \(local_rank: 0\)\s*exitcode\s*:\s*1\b", re.S)


def _by_name(tmp_path) -> dict:
    return {t.nodeid.rsplit("::", 1)[1]: t for t in _report(tmp_path).tests}


def _run_end(tmp_path, nodes: int, selection: str, shared: bool):
    (tmp_path / "test_run_end.py").write_text(RUN_END_TESTS)
    node_env = [{"TMPDIR": str(tmp_path / f"tmp-node{n}")} for n in range(nodes)]  # no local dir in common
    for env in node_env:
        os.mkdir(env["TMPDIR"])
    args = ["-m", "pytest", "test_run_end.py", "--backend", "cpu", "--rank-timeout", "5", "--conformance-report",
            "r.json", "-p", "no:cacheprovider", "-k", selection]
    if shared:
        args += ["--shared-dir", str(tmp_path / "shared")]
    return launch(tmp_path, args, nodes=nodes, nproc=2, node_env=node_env, timeout=600)


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-node-2-procs", "two-static-nodes-2-procs-each"])
def test_the_run_ends_with_rank_0s_report_and_exit_code_after_a_failure_a_kill_and_a_hang(tmp_path, nodes):
    """Rank 0 writes the whole report and exits 1; every other launcher process waits for it, then exits
    0 (a rank that exited 1 at once would have its node's torchrun kill rank 0 before the report)."""
    runs = _run_end(tmp_path, nodes, "not launcher_lost", shared=nodes > 1)
    (rc0, out0) = runs[0]
    everything = "".join(out for _, out in runs)[-6000:]
    assert [rc for rc, _ in runs] == [1] + [0] * (nodes - 1), everything
    assert ONLY_RANK_0_FAILED.search(out0), everything
    last, last_node = 2 * nodes - 1, f"node {nodes - 1}"
    report = _report(tmp_path)
    assert not any("SIGTERM" in e or "did not report" in e for e in report.events), report.events
    by_name = _by_name(tmp_path)
    assert sorted(by_name) == [f"test_{n}" for n in ("1_fails_on_the_last_launcher_only", "2_rank_killed",
                                                      "3_after_the_kill", "4_rank_hangs", "5_after_the_hang",
                                                      "6_every_rank_reads_rank_0s_file")]
    failed = by_name["test_1_fails_on_the_last_launcher_only"]
    assert failed.outcome == "failed" and "failed on the last launcher process" in failed.message
    assert [r.outcome for r in failed.ranks] == ["passed"] * last + ["failed"]
    killed, hung = by_name["test_2_rank_killed"], by_name["test_4_rank_hangs"]
    assert f"rank {last} died during die_on_last" in killed.message and "killed by SIGKILL" in killed.message
    assert last_node in killed.message, killed.message
    assert f"hang_on_last timed out after 5 s; no answer from rank {last}" in hung.message
    for name in ("test_3_after_the_kill", "test_5_after_the_hang", "test_6_every_rank_reads_rank_0s_file"):
        assert by_name[name].outcome == "passed", by_name[name]
    assert [r.node.split(" (")[0] for r in by_name["test_6_every_rank_reads_rank_0s_file"].ranks] == \
        [f"node {r // 2}" for r in range(2 * nodes)]
    leftovers = [p for d in tmp_path.glob("tmp-node*") for p in d.glob("conformance-*")]
    assert leftovers + list(tmp_path.glob("shared/*")) == []  # the shared directory and each node's went with the run


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-node-2-procs", "two-static-nodes-2-procs-each"])
def test_a_lost_launcher_process_still_yields_a_report_that_names_it(tmp_path, nodes):
    """The last launcher process is SIGKILLed: its node's torchrun sends SIGTERM to the others there,
    which still publish their verdicts; rank 0 (SIGTERMed too on one node) writes the report naming the
    lost rank. Without --shared-dir, two nodes have no directory in common: the test needing one skips."""
    runs = _run_end(tmp_path, nodes, "launcher_lost or rank_0s_file", shared=False)
    everything = "".join(out for _, out in runs)[-6000:]
    assert all(rc != 0 for rc, _ in runs), everything
    last = 2 * nodes - 1
    report = _report(tmp_path)
    assert any(e.startswith(f"rank {last} did not report its results within ") and "launcher process was lost" in e
               for e in report.events), report.events
    lost, shared = _by_name(tmp_path)["test_7_launcher_lost"], _by_name(tmp_path)["test_6_every_rank_reads_rank_0s_file"]
    assert lost.outcome in ("failed", "error") and last not in [r.rank for r in lost.ranks], lost
    if nodes == 1:  # rank 0 itself was torn down mid-test, and says so
        assert lost.message.startswith("interrupted: the launcher process of rank 0") and "SIGTERM" in lost.message
        assert shared.outcome == "passed"
    else:  # node 0 goes on: the call fails naming both ranks of the lost node; rank 2 was SIGTERMed mid-test
        assert [(r.rank, r.outcome) for r in lost.ranks] == [(0, "failed"), (1, "failed"), (2, "error")]
        for rank in lost.ranks[:2]:  # rank 2 may have published its part of the call before its SIGTERM
            assert re.search(r"the launcher process of rank (2, )?3 did not report within 15 s", rank.message), rank.message
        assert "interrupted: the launcher process of rank 2 (node 1" in lost.ranks[2].message
        assert shared.outcome == "skipped" and "this run spans 2 nodes and ctx.shared_dir is per node: pass " \
            "--shared-dir" in shared.message
