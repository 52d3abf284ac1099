"""Time to the first result of a one-test run, against the floor measured in the same run.

The floor is what no harness can beat: this process imports torch while two processes import torch
and join a gloo group (a barrier). The one-test run is ``pytest -k <one test>`` on a packaged suite
(2 ranks over gloo); its first result is the moment pytest prints the test's outcome. Runs alternate
(floor, run, floor, run, ...) so that a machine busy with something else weighs on both alike.

    python bench/startup.py [--repeat 3] [--test "test_all_reduce and SUM-float32"]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "conformance" / "suites" / "test_collectives.py"
FLOOR_RANK = """
import sys
import torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=int(sys.argv[2]), world_size=2)
dist.barrier()
dist.destroy_process_group()
"""
OUTCOMES = (" PASSED", " FAILED", " XFAIL", " XPASS", " SKIPPED", " ERROR")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def floor() -> float:
    start = time.perf_counter()
    port = _port()
    ranks = [subprocess.Popen([sys.executable, "-c", FLOOR_RANK, str(port), str(r)]) for r in range(2)]
    import torch  # noqa: F401  (the controller's own import, as a run pays it; cached after the first round)

    for rank in ranks:
        if rank.wait(timeout=300) != 0:
            raise SystemExit("floor: a rank failed")
    return time.perf_counter() - start


def one_test(selection: str) -> tuple[float, float, str]:
    """(seconds to the first result, seconds to exit, the result line)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pytest", str(SUITE), "-k", selection, "--backend", "cpu", "-v",
           "-p", "no:cacheprovider", "-p", "no:randomly"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, line_seen = None, ""
    for line in proc.stdout:
        if first is None and any(o in line for o in OUTCOMES):
            first, line_seen = time.perf_counter() - start, line.strip()
    proc.wait()
    if first is None:
        raise SystemExit(f"one-test run printed no result (exit {proc.returncode})")
    return first, time.perf_counter() - start, line_seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--test", default="test_all_reduce and SUM-float32")
    args = parser.parse_args()
    floors, firsts, totals = [], [], []
    for i in range(args.repeat):
        floors.append(floor())
        first, total, line = one_test(args.test)
        firsts.append(first)
        totals.append(total)
        print(f"round {i + 1}: floor {floors[-1]:.2f} s, first result {first:.2f} s, exit {total:.2f} s  ({line})")
    f, r, t = statistics.median(floors), statistics.median(firsts), statistics.median(totals)
    print(f"median: floor {f:.2f} s, one-test run first result {r:.2f} s (ratio {r / f:.2f}; target <= 1.5), "
          f"exit {t:.2f} s (ratio {t / f:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
