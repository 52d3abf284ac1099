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

import psutil
import pytest

OUT_DIR = os.environ.get("PROJECT_TEST_CPU_DIR")


def tree_cpu_seconds(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and every live process below it, each with its reaped children's."""
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone between the listing and the reading: its parent counts it once reaped
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class CpuPerTest:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.me = psutil.Process()
        self.seconds: dict[str, float] = {}
        self.at_start = tree_cpu_seconds(self.me)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        before = tree_cpu_seconds(self.me)
        yield
        self.seconds[item.nodeid] = self.seconds.get(item.nodeid, 0.0) + tree_cpu_seconds(self.me) - before

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        outside = tree_cpu_seconds(self.me) - self.at_start - sum(self.seconds.values())
        payload = {"tests": self.seconds, "outside_tests": outside, "at_start": self.at_start}
        (self.out_dir / f"{worker}.json").write_text(json.dumps(payload))


def pytest_configure(config):
    xdist_controller = not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None)
    if OUT_DIR and not xdist_controller and not config.pluginmanager.has_plugin("cpu_per_test_instance"):
        config.pluginmanager.register(CpuPerTest(Path(OUT_DIR)), "cpu_per_test_instance")
