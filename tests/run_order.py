"""The order of the project's own test run, from what each test file cost in the last measured run.

``tests/file_costs.json`` holds, per test file, the seconds its tests took (``wall``: setup, call and
teardown, summed) and the CPU seconds their processes used (``cpu``), written by
``python bench/project_test_time.py --write-costs tests/file_costs.json``. Two policies come from it:

- Collection order (``sort_costliest_first``): the costliest files first, by wall, so that no worker is left
  with a long file at the end. With ``--dist loadfile`` xdist hands files out in that order.
- Which file a free worker gets next (``CostAwareFileScheduling``, the ``--dist loadfile`` scheduler): with
  more workers than cores (three on two) the run is bound by CPU, and some files mostly wait (rank and call
  time-outs, a relay's back-offs, other processes): under ``WAITING_SHARE`` of a core busy over their wall
  time. More of them at once than there are workers beyond the cores leave a core idle. So while that many
  run, a worker is given the next file that computes instead, if one is among the next ``LOOKAHEAD`` of the
  order; the waiting file keeps its place and starts when fewer wait. And the waiting files run early, in
  lanes: a worker that holds one is given the next waiting file, wherever it is in the order, as is a worker
  when fewer workers than that many hold one. Left for the end of the run, they would have no computing
  files beside them to fill the cores (measured: 30-40 core-seconds idle in the last minute).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

COSTS_FILE = Path(__file__).resolve().parent / "file_costs.json"
WAITING_SHARE = 0.4  # cores busy over a file's wall time below which the file mostly waits
LOOKAHEAD = 10  # files of the costliest-first order a free worker may be given instead of the first


@dataclass(frozen=True)
class FileCost:
    wall: float  # seconds its tests took, summed
    cpu: float  # CPU seconds of the processes of its tests

    @property
    def waits(self) -> bool:
        """Whether the file mostly waits: a core less than WAITING_SHARE busy over its tests' wall time."""
        return self.wall > 0 and self.cpu < WAITING_SHARE * self.wall


class FileCosts:
    """The measured cost of each test file (by its path from the root, as in node ids); a file the table
    does not hold counts as the median file, computing all along (one core busy)."""

    def __init__(self, table: dict[str, FileCost]):
        self.table = table
        median_wall = statistics.median(c.wall for c in table.values()) if table else 0.0
        self.median = FileCost(median_wall, median_wall)

    @classmethod
    def load(cls, path: Path = COSTS_FILE) -> "FileCosts":
        raw = json.loads(path.read_text()) if path.is_file() else {}
        return cls({file: FileCost(float(cost["wall"]), float(cost["cpu"])) for file, cost in raw.items()})

    def of(self, file: str) -> FileCost:
        return self.table.get(file, self.median)


def sort_costliest_first(items, costs: FileCosts, rootpath: Path) -> None:
    """Sort collected ``items`` in place: the costliest files (by wall) first, files in their collected order
    at equal cost, and the order within each file kept."""
    file_of = {id(item): Path(str(item.path)).relative_to(rootpath).as_posix() for item in items}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(file_of[id(item)], index)
    items.sort(key=lambda item: (-costs.of(file_of[id(item)]).wall, first_seen[file_of[id(item)]]))


def waiting_allowed(workers: int, cores: int | None = None) -> int:
    """How many files that mostly wait may run at once: the workers beyond the cores (they would only
    share them), at least one; with a core for every worker, any number."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return workers - cores if workers > cores else workers


def make_scheduler(config, log, costs: FileCosts | None = None, cores: int | None = None):
    """The ``--dist loadfile`` scheduler of the project's run (pytest-xdist's, choosing the next file by cost)
    for this machine's cores, or ``cores``."""
    from xdist.scheduler import LoadFileScheduling  # here: the root conftest imports this module without xdist too

    class CostAwareFileScheduling(LoadFileScheduling):
        """pytest-xdist's ``loadfile`` scheduling, except for which queued file a worker gets (module doc)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.costs = costs if costs is not None else FileCosts.load()
            self.waiting_allowed = waiting_allowed(self.numnodes, cores)
            self.bound_by_cpu = self.waiting_allowed < self.numnodes

        def _assign_work_unit(self, node) -> None:
            chosen = self._next_file(node)
            self.workqueue.move_to_end(chosen, last=False)  # xdist assigns the head of its queue
            super()._assign_work_unit(node)

        def _unfinished(self, node) -> list[str]:
            """The files handed to ``node`` with tests still to run (running, or queued behind its current one)."""
            return [file for file, done in self.assigned_work[node].items() if not all(done.values())]

        def _holds_waiting_file(self, node) -> bool:
            return any(self.costs.of(file).waits for file in self._unfinished(node))

        def _next_file(self, node) -> str:
            first = next(iter(self.workqueue))
            if self.bound_by_cpu:
                lanes = sum(self._holds_waiting_file(other) for other in self.assigned_work)
                if self._holds_waiting_file(node) or lanes < self.waiting_allowed:
                    return next((file for file in self.workqueue if self.costs.of(file).waits), first)
            elif sum(self.costs.of(file).waits for other in self.assigned_work
                     for file in self._unfinished(other)) < self.waiting_allowed:
                return first
            for file in itertools.islice(self.workqueue, LOOKAHEAD):
                if not self.costs.of(file).waits:
                    return file
            return first

    return CostAwareFileScheduling(config, log)
