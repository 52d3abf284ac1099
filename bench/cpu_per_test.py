"""A pytest plugin for bench/project_test_time.py: the CPU seconds each test costs, its processes included.

On two cores the project's test command is bound by CPU, not by wall time: a test that sleeps on a time-out
costs a worker's slot but no core, while one that starts five interpreters importing torch costs both. This
plugin counts, around each test, the CPU time of the xdist worker and of every process below it (rank pools,
pytester and ``conformance run`` subprocesses, torchrun, ``relay serve``, act): a process's own time while it
lives, and its parent's children time once reaped. A session-scoped helper's time falls on the tests running
while it works; per file the sums are right. Each worker writes ``{nodeid: seconds}`` to a JSON file in the
folder named by ``PROJECT_TEST_CPU_DIR`` (an xdist controller, whose tree holds its workers, writes none);
without it the plugin does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OUT_DIR = os.environ.get("PROJECT_TEST_CPU_DIR")
_PROC = Path("/proc")


class ProcessTree:
    """CPU seconds of a process and every live process below it, each with its reaped children's, read from
    ``/proc`` before and after every test.

    psutil's walk (``children(recursive=True)``) reads every process of the machine on each call: with the run's
    few hundred processes, about 6 ms a test, 15 % more CPU on a run of short tests. Here each call lists ``/proc``, reads
    the parent of each process it has not seen before (kept: the kernel hands out process ids in turn, so an id
    comes back only after the counter wraps, not between two calls), and reads the times of the tree's own
    processes only."""

    def __init__(self, root: int):
        self.root = root
        self.tick = os.sysconf("SC_CLK_TCK")
        self.parent_of: dict[int, int] = {}

    @staticmethod
    def _stat(pid: int) -> list[str] | None:
        """The fields of /proc/<pid>/stat after the command name (which may hold spaces), or None if gone."""
        try:
            return (_PROC / str(pid) / "stat").read_bytes().rsplit(b")", 1)[1].decode().split()
        except (OSError, IndexError):
            return None

    def cpu_seconds(self) -> float:
        live = {int(name) for name in os.listdir(_PROC) if name.isdigit()}
        for pid in self.parent_of.keys() - live:
            del self.parent_of[pid]
        for pid in live - self.parent_of.keys():
            fields = self._stat(pid)
            if fields is not None:
                self.parent_of[pid] = int(fields[1])
        children: dict[int, list[int]] = {}
        for pid, parent in self.parent_of.items():
            children.setdefault(parent, []).append(pid)
        total, stack = 0, [self.root]
        while stack:
            pid = stack.pop()
            fields = self._stat(pid)
            if fields is None:  # gone since the listing: its parent counts it once reaped
                continue
            total += sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
            stack.extend(children.get(pid, ()))
        return total / self.tick


class CpuPerTest:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.tree = ProcessTree(os.getpid())
        self.seconds: dict[str, float] = {}
        self.at_start = self.tree.cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        before = self.tree.cpu_seconds()
        yield
        self.seconds[item.nodeid] = self.seconds.get(item.nodeid, 0.0) + self.tree.cpu_seconds() - before

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        outside = self.tree.cpu_seconds() - self.at_start - sum(self.seconds.values())
        payload = {"tests": self.seconds, "outside_tests": outside, "at_start": self.at_start}
        (self.out_dir / f"{worker}.json").write_text(json.dumps(payload))


def pytest_configure(config):
    xdist_controller = not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None)
    if OUT_DIR and not xdist_controller and not config.pluginmanager.has_plugin("cpu_per_test_instance"):
        config.pluginmanager.register(CpuPerTest(Path(OUT_DIR)), "cpu_per_test_instance")
