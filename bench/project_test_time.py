"""Where the project's own test time goes: the README's test command, timed per test and per folder.

    python bench/project_test_time.py [--top 30] [--depth 2] [--write-costs tests/file_costs.json] [-- <pytest arguments>]

Runs the test command (default ``python -m pytest -n 3 --dist loadfile``, the README's) once with a
JUnit file, then prints the wall time, the summed time of every test (setup, call and teardown), how
busy the xdist workers were (summed time / (wall x workers), against a perfectly packed run: 100 %),
the total per test folder (``--depth`` path parts) and the slowest tests, each in wall seconds and in CPU
seconds with the test's processes (bench/cpu_per_test.py: on two cores the CPU is what runs out, so a test
waiting on a time-out is long but cheap). The wall ends when pytest exits; processes the run left behind are
named, and waited for apart. It also prints the cores' idle time during the command and, as a gauge of the
machine's speed at the time (it drifts by a tenth within hours), the CPU of a fresh ``import torch`` just
before. Repeatable: run it on a quiet machine, from a fresh clone, and compare its lines before and after a
change, at like gauges. ``--write-costs`` also
writes each test file's summed seconds and CPU seconds to a JSON file: ``tests/file_costs.json`` is the
table the test run's order comes from (tests/run_order.py: the costliest files start first, and the files
that mostly wait do not run beside each other).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = ["-n", "3", "--dist", "loadfile"]


def workers_of(pytest_args: list[str]) -> int:
    for index, arg in enumerate(pytest_args):
        if arg in ("-n", "--numprocesses") and index + 1 < len(pytest_args) and pytest_args[index + 1].isdigit():
            return int(pytest_args[index + 1])
        if arg.startswith("-n") and arg[2:].isdigit():
            return int(arg[2:])
    return 1


def test_path(case: ET.Element) -> str:
    """tests/relay/intake/test_x.py from a JUnit test case (its file, else its dotted class name)."""
    file = case.get("file")
    if file:
        return file
    classname = case.get("classname", "")
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        candidate = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / candidate).is_file():
            return str(candidate)
    return classname


def adopt_orphans() -> None:
    """Make this process the reaper of every process the run leaves behind (Linux): a server that outlives
    its parent (multiprocessing's forkserver, which holds the relays it forked) is then reaped here, and its
    CPU counted in this process's children's time, not lost to init."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def orphan_names() -> list[str]:
    """The command lines of this process's children still running (after the test command ended: what it left
    behind)."""
    names = []
    try:
        children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    except OSError:  # a kernel without that file: nothing named
        return names
    for child in children:
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # ended already, only not yet reaped
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        names.append(f"{child} {cmdline.strip()[:120]}")
    return names


def reap_orphans(grace: float = 10.0) -> bool:
    """Reap what the run left behind (``adopt_orphans``), waiting up to ``grace`` seconds for it to end;
    whether all of it ended."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def import_torch_cpu(runs: int = 3) -> float:
    """The least CPU seconds of ``runs`` fresh interpreters importing torch: how fast the machine is right now
    (it drifts by a tenth from one hour to the next), so that two runs' figures can be compared."""
    best = float("inf")
    for _ in range(runs):
        before = os.times()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        after = os.times()
        best = min(best, after.children_user - before.children_user + after.children_system - before.children_system)
    return best


def idle_core_seconds() -> float | None:
    """The machine's idle (and I/O wait) time so far, in core-seconds, from ``/proc/stat``; None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def folder_of(path: str, depth: int) -> str:
    return "/".join(Path(path).parts[:depth])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=30, help="slowest tests to list (default 30)")
    parser.add_argument("--depth", type=int, default=2, help="path parts per folder total (default 2)")
    parser.add_argument("--write-costs", type=Path, default=None, metavar="PATH",
                        help="also write each test file's wall and CPU seconds as JSON (tests/file_costs.json orders the run)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: the test command's arguments")
    args = parser.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"] or DEFAULT_COMMAND
    with tempfile.TemporaryDirectory() as tmp:
        junit, cpu_dir = Path(tmp) / "junit.xml", Path(tmp) / "cpu"
        cpu_dir.mkdir()
        command = [sys.executable, "-m", "pytest", *pytest_args, "-q", f"--junitxml={junit}",
                   "-o", "junit_duration_report=total", "-o", "junit_family=xunit1", "-p", "cpu_per_test"]
        env = {**os.environ, "PROJECT_TEST_CPU_DIR": str(cpu_dir),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))}
        reference = import_torch_cpu()
        adopt_orphans()
        start, cpu_start, idle_start = time.perf_counter(), os.times(), idle_core_seconds()
        result = subprocess.run(command, cwd=ROOT, env=env)
        # The command's wall ends when pytest exits (what its caller waits for); what it left running is
        # then waited for (its CPU belongs to the run) and reported, apart.
        wall, idle_end = time.perf_counter() - start, idle_core_seconds()
        left_behind = orphan_names() if sys.platform.startswith("linux") else []
        orphans_ended = reap_orphans()
        orphans_wall, cpu_end = time.perf_counter() - start - wall, os.times()
        if not junit.is_file():
            print(f"pytest wrote no JUnit file (exit {result.returncode})", file=sys.stderr)
            return 2
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        cpu_of_test: dict[str, float] = {}
        cpu_outside_tests = 0.0
        for worker_file in cpu_dir.glob("*.json"):
            worker = json.loads(worker_file.read_text())
            cpu_of_test.update(worker["tests"])
            cpu_outside_tests += worker["outside_tests"] + worker["at_start"]
    run_cpu = (cpu_end.children_user - cpu_start.children_user) + (cpu_end.children_system - cpu_start.children_system)

    outcomes: collections.Counter[str] = collections.Counter()
    per_folder: collections.Counter[str] = collections.Counter()
    per_file: collections.Counter[str] = collections.Counter()
    timed: list[tuple[float, str]] = []
    for case in cases:
        seconds = float(case.get("time") or 0)
        path = test_path(case)
        children = {child.tag for child in case}
        outcomes["skipped" if "skipped" in children else "failed" if children & {"failure", "error"} else "passed"] += 1
        per_folder[folder_of(path, args.depth)] += seconds
        per_file[path] += seconds
        timed.append((seconds, f"{path}::{case.get('name')}"))
    cpu_per_folder: collections.Counter[str] = collections.Counter()
    cpu_per_file: collections.Counter[str] = collections.Counter()
    for nodeid, seconds in cpu_of_test.items():
        path = nodeid.split("::", 1)[0]
        cpu_per_folder[folder_of(path, args.depth)] += seconds
        cpu_per_file[path] += seconds
    total = sum(seconds for seconds, _ in timed)
    workers = workers_of(pytest_args)

    print(f"\ncommand: python -m pytest {' '.join(pytest_args)}  (exit {result.returncode})")
    print(f"wall {wall:.1f} s; tests {len(cases)} ({', '.join(f'{n} {o}' for o, n in outcomes.most_common())}); "
          f"summed test time {total:.1f} s")
    if left_behind:
        ending = f"ended {orphans_wall:.1f} s later" if orphans_ended else f"still running {orphans_wall:.1f} s later"
        print(f"left running when pytest exited ({ending}): " + "; ".join(left_behind))
    print(f"worker use: {total / wall:.2f} of {workers} workers busy on average ({total / (wall * workers):.0%}; "
          "100 % is a perfectly packed run, the rest is start-up, collection and idle tails)")
    print(f"CPU: {run_cpu:.1f} s in all ({run_cpu / wall:.2f} cores busy on average): "
          f"{sum(cpu_of_test.values()):.1f} s in tests, {cpu_outside_tests:.1f} s in the workers outside them "
          "(start-up, collection, session fixtures' ends); the rest is the xdist controller and "
          "servers outside the run (PostgreSQL)")
    idle = (f"{idle_end - idle_start:.1f} core-seconds idle of {wall * os.cpu_count():.0f}" if idle_start is not None
            else "idle unknown")
    print(f"the machine: {idle} during the command; `import torch` took {reference:.2f} s of CPU before it "
          "(least of 3: compare runs at like figures)")
    print(f"\nper folder (depth {args.depth}): wall, CPU")
    for folder, seconds in per_folder.most_common():
        print(f"  {seconds:8.1f} s {cpu_per_folder[folder]:8.1f} s  {folder}")
    print("\ncostliest files: wall, CPU (by CPU)")
    for path, cpu in cpu_per_file.most_common(20):
        print(f"  {per_file[path]:8.1f} s {cpu:8.1f} s  {path}")
    if args.write_costs is not None:
        costs = {path: {"wall": round(seconds, 1), "cpu": round(cpu_per_file[path], 1)}
                 for path, seconds in sorted(per_file.items())}
        args.write_costs.write_text(json.dumps(costs, indent=1) + "\n")
        print(f"\nwrote the cost of {len(costs)} files to {args.write_costs}")
    print(f"\nslowest {args.top} tests (wall):")
    for seconds, name in sorted(timed, reverse=True)[: args.top]:
        print(f"  {seconds:8.1f} s  {name}")
    print(f"\ncostliest {args.top} tests (CPU):")
    for name, cpu in sorted(cpu_of_test.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {cpu:8.1f} s  {name}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
