"""bench/cpu_per_test.py's reading of a process tree's CPU (``ProcessTree``) agrees with psutil's and counts a
child's CPU while it lives and after it is reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bench.cpu_per_test import ProcessTree

BURN = "import sys, time\nend = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < end: pass\n"


def psutil_tree_cpu_seconds(root: psutil.Process) -> float:
    """The same figure through psutil, which reads every process of the machine to find the tree."""
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone between the listing and the reading: its parent counts it once reaped
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _burn(seconds: float, then_wait: bool) -> subprocess.Popen:
    """A child that uses ``seconds`` of CPU, then exits or (``then_wait``) waits for its standard input."""
    code = BURN + ("sys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.read()\n" if then_wait else "")
    return subprocess.Popen([sys.executable, "-c", code, str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _agree(tree: ProcessTree) -> tuple[float, float]:
    """Both readings, taken until two in a row agree on the tree (a process of it may tick between them)."""
    for _ in range(20):
        ours, psutils = tree.cpu_seconds(), psutil_tree_cpu_seconds(psutil.Process())
        if abs(ours - psutils) < 0.03:
            return ours, psutils
        time.sleep(0.05)
    raise AssertionError(f"ProcessTree read {ours:.2f} s, psutil {psutils:.2f} s")


def test_a_live_and_a_reaped_child_count_as_psutil_counts_them():
    tree = ProcessTree(os.getpid())
    start, _ = _agree(tree)
    children = [_burn(0.4, then_wait=True), _burn(0.3, then_wait=False)]
    try:
        live, reaped = children
        assert live.stdout.readline() == "done\n"
        reaped.wait(30)
        with_both, _ = _agree(tree)
        assert with_both - start >= 0.65, (start, with_both)  # both children's CPU, the live one's unreaped
        children.append(_burn(0.0, then_wait=True))  # one more process, started after the tree was listed
        assert children[-1].stdout.readline() == "done\n"
        _agree(tree)
    finally:
        for child in children:
            child.kill()
            child.wait(30)
    after, _ = _agree(tree)
    assert after - start >= 0.65, (start, after)  # all reaped now: counted in this process's children's time


def test_a_tree_whose_root_is_gone_reads_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    assert ProcessTree(child.pid).cpu_seconds() == 0.0
