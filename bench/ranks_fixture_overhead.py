"""Per-test cost of the ``ranks`` fixture against a plain pytest test, measured in the same run.

Writes a throw-away test module with ``--tests`` one-call tests (each takes ``ranks`` and makes one
``ranks.run`` of a trivial function on every rank) and as many plain tests (an assertion, no
fixture), runs them interleaved in one pytest session on the CPU backend, and times each test's
whole protocol (setup, call, teardown) with a hook. Prints the median and p90 of both and their
ratio; the pool's start-up (the first ranks test) is left out.

    python bench/ranks_fixture_overhead.py [--tests 200] [--world-size 2] [--repeat 3] [--profile FILE]

``--profile FILE`` also runs the session under cProfile and writes its stats to FILE (read them with
``python -m pstats FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEST_MODULE = '''
def trivial(ctx):
    return ctx.rank


def _ranks_test(ranks):
    assert ranks.run(trivial) == list(range(ranks.world_size))


def _plain_test():
    assert [0, 1] == list(range(2))


for _i in range({tests}):
    globals()[f"test_ranks_{{_i:03d}}"] = _ranks_test
    globals()[f"test_plain_{{_i:03d}}"] = _plain_test
'''

# Times every test's whole protocol (setup + call + teardown), written to $TIMINGS at the end.
CONFTEST = '''
import json, os, time
import pytest

_times = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.perf_counter()
    yield
    _times[item.name] = time.perf_counter() - started


def pytest_sessionfinish(session):
    with open(os.environ["TIMINGS"], "w") as out:
        json.dump(_times, out)
'''


def _run_once(tests: int, world_size: int, profile: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ranks-fixture-bench-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "test_overhead.py").write_text(TEST_MODULE.format(tests=tests))
        (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
        timings = tmp_path / "timings.json"
        env = {**os.environ, "TIMINGS": str(timings),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        runner = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else []) + ["-m", "pytest"]
        command = runner + [str(tmp_path / "test_overhead.py"), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "--backend", "cpu", "--world-size", str(world_size), "-o", "addopts="]
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the benchmark session failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return json.loads(timings.read_text())


def _summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered) * 1e3, ordered[int(0.9 * (len(ordered) - 1))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200, help="tests of each kind (default 200)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="sessions to run (default 3)")
    parser.add_argument("--profile", help="write cProfile stats of the (last) session to this file")
    args = parser.parse_args()
    sessions = []
    for attempt in range(args.repeat):
        times = _run_once(args.tests, args.world_size, args.profile if attempt == args.repeat - 1 else None)
        ranked = [t for name, t in sorted(times.items()) if name.startswith("test_ranks_")][1:]  # not the start-up
        plain = [t for name, t in times.items() if name.startswith("test_plain_")]
        (ranks_p50, ranks_p90), (plain_p50, plain_p90) = _summary(ranked), _summary(plain)
        sessions.append((ranks_p50, plain_p50))
        print(f"session {attempt + 1}: ranks test p50 {ranks_p50:.3f} ms (p90 {ranks_p90:.3f}), plain test p50 "
              f"{plain_p50:.3f} ms (p90 {plain_p90:.3f}); ratio {ranks_p50 / plain_p50:.2f}x")
    ranks_ms, plain_ms = (statistics.median(s[i] for s in sessions) for i in (0, 1))
    print(json.dumps({"name": "ranks_fixture_overhead",
                      "figures": {"ranks_test_p50_ms": round(ranks_ms, 3), "plain_test_p50_ms": round(plain_ms, 3),
                                  "sessions": len(sessions)},
                      "ratio": round(ranks_ms / plain_ms, 2)}))


if __name__ == "__main__":
    main()
