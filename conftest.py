"""The project's own test runs (not a user's `conformance run`): rank functions see `meta` as their default
device, so a suite body that creates a tensor without `ctx.device` fails here as it would on a GPU.
Set before any pool starts; rank processes, xdist workers and `conformance run` subprocesses inherit it."""

import os
import sys
from pathlib import Path

import pytest

from tests import run_order

os.environ.setdefault("CONFORMANCE_RANK_DEFAULT_DEVICE", "meta")

# The run starts hundreds of fresh interpreters (xdist workers, pytester and `conformance run` subprocesses,
# rank processes, torchrun's, `relay serve`): with PYTHONDONTWRITEBYTECODE set (some images set it), each one
# compiles the project's modules again and pytest rewrites every plugin module again. The tests write their
# caches; what they check does not depend on it (docs/benchmarks.md, "Bytecode caches in the test run").
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


# The pytest plugins installed for the project's own API-fuzzing and property tests (schemathesis, hypothesis)
# and anyio's, which no test uses. The plain pytest processes that tests start (pytester's, a bare
# `python -m pytest`) run the suites and load none of them: about 1 s less of start-up each, and closer to a
# user's `.[suite]` install, which has none of them. (`conformance run` loads none of them anyway.)
_BLOCK_UNUSED_PLUGINS = " ".join(f"-p no:{name}" for name in ("schemathesis", "hypothesispytest", "anyio"))


def pytest_configure(config):
    # pytest-xdist's default for --dist loadfile (--loadscope-reorder) hands out the files with the most tests
    # first, whatever their cost: torchrun's eight tests, the longest file, then started last and ran alone at
    # the end. The scheduler is to follow the order of the costs (pytest_collection_modifyitems below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # Not in a process about to start xdist workers: they run the tests that need these plugins.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        os.environ["PYTEST_ADDOPTS"] = f"{os.environ.get('PYTEST_ADDOPTS', '')} {_BLOCK_UNUSED_PLUGINS}".strip()


def keeps_torch_imported(name: str) -> bool:
    """What pytester leaves imported when it restores ``sys.modules`` after a test or an in-process run: its own
    exceptions (zope, readline), and torch. A torch module taken out of ``sys.modules`` cannot be imported again
    in that process: its operator library is still registered ("Only a single TORCH_LIBRARY can be used to
    register the namespace symm_mem"), so a test that first imported one under pytester would break every later
    test of its worker that imports it."""
    return name == "torch" or name.startswith(("torch.", "zope", "readline"))


@pytest.fixture(autouse=True)
def _pytester_runs_without_unused_plugins(request, monkeypatch):
    """pytester clears PYTEST_ADDOPTS for its runs: give them back the plugins' block (and nothing else); and
    it keeps torch's modules imported (``keeps_torch_imported``)."""
    if "pytester" not in request.fixturenames:
        return
    from _pytest.pytester import SysModulesSnapshot

    pytester = request.getfixturevalue("pytester")
    monkeypatch.setenv("PYTEST_ADDOPTS", _BLOCK_UNUSED_PLUGINS)

    def snapshot():
        return SysModulesSnapshot(preserve=keeps_torch_imported)

    pytester._sys_modules_snapshot = snapshot()  # the one restored after the test (nothing imported since it)
    monkeypatch.setattr(pytester, "_Pytester__take_sys_modules_snapshot", snapshot)  # each in-process run's


# The order of the project's own test run (tests/run_order.py): the costliest test files first, by what each
# cost in the last measured run (tests/file_costs.json), and with `--dist loadfile` a scheduler that keeps the
# files that mostly wait from running beside each other. The order within a file is kept.
def pytest_collection_modifyitems(session, config, items):
    if config.getoption("randomly_seed", None) is not None:
        return
    run_order.sort_costliest_first(items, run_order.FileCosts.load(), Path(str(config.rootpath)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return run_order.make_scheduler(config, log) if config.getvalue("dist") == "loadfile" else None
