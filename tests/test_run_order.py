"""The project's own run hands its test files to xdist's workers in the order of their measured cost
(tests/run_order.py).

The root conftest sorts the collected files costliest first (``tests/file_costs.json``) and turns off
pytest-xdist's ``--loadscope-reorder``, which would otherwise queue the files with the most tests first: the
longest file, torchrun's eight tests, then started last and ran alone at the end of the run. Its scheduler
gives a free worker a file that computes while a file that mostly waits runs on another.
"""

from __future__ import annotations

import json
import types

import pytest

from tests import run_order
from tests.run_order import FileCost, FileCosts

xdist_scheduler = pytest.importorskip("xdist.scheduler", reason="pytest-xdist schedules the README's test command")


class _Worker:
    """What the scheduler calls on a worker: the indices of the tests it is sent, in order."""

    def __init__(self, name: str = "gw0"):
        self.sent: list[int] = []
        self.shutting_down = False
        self.gateway = types.SimpleNamespace(id=name)  # named when collections are compared

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


class _RunConfig:
    """A configuration with ``workers`` workers to schedule for, as the controller of an ``-n`` run has it, and
    ``option``: this run's options (as the root conftest left them), or xdist's ``--loadscope-reorder`` off as
    that conftest turns it off."""

    def __init__(self, option, workers: int = 1):
        self.option = option
        self.workers = workers

    def getvalue(self, name: str):
        return [f"{self.workers}*popen"] if name == "tx" else getattr(self.option, name)


AS_THE_CONFTEST_LEAVES_IT = types.SimpleNamespace(loadscopereorder=False)


WAITS, COMPUTES = FileCost(wall=30.0, cpu=1.0), FileCost(wall=10.0, cpu=9.0)


def _scheduled(files: list[str], costs: dict[str, FileCost], workers: int = 1, cores: int = 1):
    """The scheduler for ``cores`` (one: one file that waits at a time), its workers and the collection (one test
    per file, in ``files``' order), scheduled."""
    collection = [f"tests/{name}.py::test_one" for name in files]
    scheduler = run_order.make_scheduler(_RunConfig(AS_THE_CONFTEST_LEAVES_IT, workers), None,
                                         FileCosts({f"tests/{name}.py": cost for name, cost in costs.items()}),
                                         cores=cores)
    nodes = [_Worker(f"gw{n}") for n in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes, collection


def _files(node: _Worker, collection: list[str]) -> list[str]:
    return [collection[i].split("/")[1].split(".py")[0] for i in node.sent]


def test_loadfile_hands_out_files_in_collection_order_not_by_their_number_of_tests(pytestconfig):
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.skip("pytest-xdist's plugin is off in this run (-p no:xdist): no --loadscope-reorder to have turned off")
    collection = ["tests/costly.py::test_one", "tests/many.py::test_a", "tests/many.py::test_b",
                  "tests/many.py::test_c", "tests/cheap.py::test_one"]
    scheduler = run_order.make_scheduler(_RunConfig(pytestconfig.option), None, FileCosts({}))
    worker = _Worker()
    scheduler.add_node(worker)
    scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert [collection[i] for i in worker.sent][:1] == ["tests/costly.py::test_one"]


def test_a_free_worker_gets_a_file_that_computes_while_a_file_that_waits_runs():
    costs = {"wait1": WAITS, "wait2": WAITS, "compute1": COMPUTES, "compute2": COMPUTES}
    _, (a, b), collection = _scheduled(["wait1", "wait2", "compute1", "compute2"], costs, workers=2)
    assert _files(a, collection)[0] == "wait1"
    assert _files(b, collection)[0] == "compute1"  # xdist's own order would start wait2 beside wait1


def test_a_waiting_file_passed_over_starts_once_no_other_waits():
    costs = {"wait1": WAITS, "wait2": WAITS, "compute1": COMPUTES, "compute2": COMPUTES}
    scheduler, (worker,), collection = _scheduled(["wait1", "wait2", "compute1", "compute2"], costs)
    assert _files(worker, collection) == ["wait1", "compute1"]  # compute1 queued behind wait1, wait2 passed over
    scheduler.mark_test_complete(worker, collection.index("tests/wait1.py::test_one"))
    assert _files(worker, collection) == ["wait1", "compute1", "wait2"]  # only compute1 runs: wait2 keeps its place
    scheduler.mark_test_complete(worker, collection.index("tests/compute1.py::test_one"))
    assert _files(worker, collection) == ["wait1", "compute1", "wait2", "compute2"]


def test_with_more_workers_than_cores_waiting_files_run_first_in_one_lane_wherever_they_are_in_the_order():
    # Left at the end of the order, waiting files would run with nothing beside them to use the cores.
    costs = {"compute1": COMPUTES, "compute2": COMPUTES, "compute3": COMPUTES, "wait1": WAITS, "wait2": WAITS}
    scheduler, (a, b), collection = _scheduled(["compute1", "compute2", "compute3", "wait1", "wait2"], costs, workers=2)
    assert _files(a, collection) == ["wait1", "wait2"]  # the lane holds a waiting file: the next one queues there
    assert _files(b, collection) == ["compute1", "compute2"]
    scheduler.mark_test_complete(a, collection.index("tests/wait1.py::test_one"))
    scheduler.mark_test_complete(a, collection.index("tests/wait2.py::test_one"))
    assert _files(a, collection) == ["wait1", "wait2", "compute3"]  # no waiting file left


def test_a_worker_running_a_computing_file_gets_a_waiting_file_only_when_a_lane_is_free():
    costs = {"compute1": COMPUTES, "compute2": COMPUTES, "compute3": COMPUTES, "wait1": WAITS, "wait2": WAITS,
             "wait3": WAITS}
    scheduler, (a, b), collection = _scheduled(["compute1", "compute2", "compute3", "wait1", "wait2", "wait3"],
                                               costs, workers=2)
    assert _files(b, collection) == ["compute1", "compute2"]
    scheduler.mark_test_complete(b, collection.index("tests/compute1.py::test_one"))
    assert _files(b, collection) == ["compute1", "compute2", "compute3"]  # a's lane is the one allowed


def test_with_a_core_for_every_worker_files_go_costliest_first_whether_they_wait_or_not():
    costs = {"compute1": COMPUTES, "compute2": COMPUTES, "wait1": WAITS}
    _, (a, b), collection = _scheduled(["compute1", "compute2", "wait1"], costs, workers=2, cores=2)
    assert _files(a, collection) == ["compute1", "wait1"] and _files(b, collection) == ["compute2"]


def test_with_no_file_that_computes_within_the_lookahead_the_next_file_goes_as_ordered():
    waiting = [f"wait{n}" for n in range(run_order.LOOKAHEAD + 1)]
    costs = {**{name: WAITS for name in waiting}, "compute": COMPUTES}
    _, (worker,), collection = _scheduled([*waiting, "compute"], costs)
    assert _files(worker, collection) == ["wait0", "wait1"]


def test_as_many_files_may_wait_at_once_as_there_are_workers_beyond_the_cores():
    assert [run_order.waiting_allowed(workers, cores=2) for workers in (3, 4, 6)] == [1, 2, 4]
    assert run_order.waiting_allowed(3, cores=3) == 3 and run_order.waiting_allowed(3, cores=16) == 3  # no limit


def test_a_file_the_table_does_not_hold_counts_as_the_median_file_that_computes():
    costs = FileCosts({"a.py": FileCost(30.0, 1.0), "b.py": FileCost(10.0, 9.0), "c.py": FileCost(2.0, 2.0)})
    assert costs.of("new.py") == FileCost(10.0, 10.0) and not costs.of("new.py").waits
    assert costs.of("a.py").waits and not costs.of("b.py").waits


def test_the_committed_table_holds_the_wall_and_cpu_seconds_of_existing_files(pytestconfig):
    raw = json.loads(run_order.COSTS_FILE.read_text())
    assert raw and all(set(cost) == {"wall", "cpu"} for cost in raw.values()), "rewrite it with --write-costs"
    missing = [file for file in raw if not (pytestconfig.rootpath / file).is_file()]
    assert missing == [], f"tests/file_costs.json names files that are gone: {missing}; rewrite it with --write-costs"
