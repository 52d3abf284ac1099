"""What starting rank processes costs, fresh interpreters against forks of the controller's server.

For each start method (``spawn``, then ``forkserver``), one controller process starts ``--pools`` CPU pools
one after the other (as a session does when it respawns after a crash, or runs a second world size),
each until its first result; prints the time to the first pool's first result, the median for the later
pools, and the CPU time of the controller with every process it started (its ranks, and the fork
server with the ranks it forked). The ratio is spawn's CPU over the fork server's.

    python bench/rank_start.py [--pools 4] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTROLLER = """
import json, sys, time
from conformance.ranks import RankPool
from tests.conformance import rank_functions as fns

method, pools, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
starts = []
for _ in range(pools):
    started = time.perf_counter()
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=world_size,
                  start_method=method) as pool:
        pool.run(fns.rank_and_sum, 0)
        starts.append(time.perf_counter() - started)
print(json.dumps(starts))
"""


def _measure(method: str, pools: int, world_size: int) -> tuple[list[float], float]:
    """(seconds to each pool's first result, CPU seconds of the controller and everything it started)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, method, str(pools), str(world_size)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)  # counts the reaped descendants: ranks, the server's ranks
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"the {method} controller failed ({proc.returncode}):\n{out}")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=4, help="pools started one after another (default 4)")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    cpu = {}
    for method in ("spawn", "forkserver"):
        starts, cpu[method] = _measure(method, args.pools, args.world_size)
        later = statistics.median(starts[1:]) if len(starts) > 1 else float("nan")
        print(f"{method:>10}: first pool {starts[0]:.2f} s to its first result, later pools {later:.2f} s (median), "
              f"CPU {cpu[method]:.1f} s for {args.pools} pools of {args.world_size} ranks")
    print(json.dumps({"name": "rank_start", "figures": {"pools": args.pools, "world_size": args.world_size,
                                                        "spawn_cpu_s": round(cpu["spawn"], 2),
                                                        "forkserver_cpu_s": round(cpu["forkserver"], 2)},
                      "ratio": round(cpu["spawn"] / cpu["forkserver"], 2)}))


if __name__ == "__main__":
    main()
