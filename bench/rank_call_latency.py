"""How long a trivial ``ranks.run`` call takes when the ranks have been idle, against back-to-back calls.

One CPU pool; ``--calls`` calls of a function that only returns the rank, each after a busy gap of 0 ms
(the baseline: the ranks' cores are still awake), then of each ``--gaps`` length in milliseconds (the
controller works, as pytest does between two tests, while the ranks sleep). Prints the median per gap and
its ratio to the baseline: what remains of the ``ranks`` fixture's cost over a plain test
(``bench/ranks_fixture_overhead.py``) that no change to the pool's code removes.

    python bench/rank_call_latency.py [--calls 2000] [--gaps 1 3] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.ranks import RankPool  # noqa: E402
from tests.conformance import rank_functions as fns  # noqa: E402


def _busy(seconds: float) -> None:
    """Keep this (the controller's) core busy, as pytest's own work between tests does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per gap (default 2000)")
    parser.add_argument("--gaps", type=float, nargs="+", default=[1.0, 3.0], help="gaps in ms (default 1 3)")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    medians = {}
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=args.world_size) as pool:
        pool.run(fns.rank_only)  # start-up, not measured
        for gap_ms in [0.0, *args.gaps]:
            times = []
            for _ in range(args.calls):
                _busy(gap_ms / 1e3)
                started = time.perf_counter()
                pool.run(fns.rank_only)
                times.append(time.perf_counter() - started)
            medians[gap_ms] = statistics.median(times) * 1e3
            print(f"after a {gap_ms:g} ms gap: median call {medians[gap_ms]:.3f} ms "
                  f"({medians[gap_ms] / medians[0.0]:.2f}x back to back)")
    print(json.dumps({"name": "rank_call_latency", "figures": {f"gap_{g:g}ms_median_ms": round(m, 3)
                                                              for g, m in medians.items()},
                      "ratio": round(medians[max(medians)] / medians[0.0], 2)}))


if __name__ == "__main__":
    main()
