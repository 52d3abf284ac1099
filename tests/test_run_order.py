"""The project's own run hands its test files to xdist's workers in the order of their measured cost.

The root conftest sorts the collected files costliest first (``tests/file_costs.json``) and turns off
pytest-xdist's ``--loadscope-reorder``, which would otherwise queue the files with the most tests first: the
longest file, torchrun's eight tests, then started last and ran alone at the end of the run.
"""

from __future__ import annotations

import pytest

xdist_scheduler = pytest.importorskip("xdist.scheduler", reason="pytest-xdist schedules the README's test command")


class _Worker:
    """What the scheduler calls on a worker: the indices of the tests it is sent, in order."""

    def __init__(self):
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


class _RunConfig:
    """This run's configuration (its options, as the root conftest left them) with one worker to schedule for,
    as the controller of an ``-n`` run has it."""

    def __init__(self, config: pytest.Config):
        self.option = config.option

    def getvalue(self, name: str):
        return ["popen"] if name == "tx" else getattr(self.option, name)


def test_loadfile_hands_out_files_in_collection_order_not_by_their_number_of_tests(pytestconfig):
    collection = ["tests/costly.py::test_one", "tests/many.py::test_a", "tests/many.py::test_b",
                  "tests/many.py::test_c", "tests/cheap.py::test_one"]
    scheduler = xdist_scheduler.LoadFileScheduling(_RunConfig(pytestconfig))
    worker = _Worker()
    scheduler.add_node(worker)
    scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert [collection[i] for i in worker.sent][:1] == ["tests/costly.py::test_one"]
