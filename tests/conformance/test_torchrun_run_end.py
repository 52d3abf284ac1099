"""How a torchrun run ends, on one node of 2 launcher processes and on 2 static nodes of 2: a failing test, a
rank that dies or hangs fail their test while the run goes on, rank 0's report and exit code carry every
rank's outcome, a lost launcher process is named in the report, and nothing is left behind."""

from __future__ import annotations

import os
import re

import pytest

from tests.conformance.torchrun_launch import launch, report_in

pytestmark = pytest.mark.slow

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
    return {t.nodeid.rsplit("::", 1)[1]: t for t in report_in(tmp_path).tests}


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
    report = report_in(tmp_path)
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
    report = report_in(tmp_path)
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
            # Which exchange, and how far the lost process got: what tells a lost process from diverged ones.
            assert re.search(r"the launcher process of rank (2, )?3 did not report within 15 s at exchange \d+ "
                             r"\(waiting for error or result; rank [23](( left no reply in the store)|"
                             r"('s last reply in the store is at exchange \d+))", rank.message), rank.message
        assert "interrupted: the launcher process of rank 2 (node 1" in lost.ranks[2].message
        assert shared.outcome == "skipped" and "this run spans 2 nodes and ctx.shared_dir is per node: pass " \
            "--shared-dir" in shared.message
