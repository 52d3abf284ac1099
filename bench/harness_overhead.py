"""Per-call overhead of the persistent rank pool against spawn-per-test, measured in the same run.

Spawn-per-test is what torch's MultiProcessTestCase does for every test: spawn the ranks, initialise
the process group, run the function, tear everything down. The pool pays that once and then only
sends a message per call. Both run the same trivial 2-rank function (an all_reduce of one element).

    python bench/harness_overhead.py [--calls 300] [--spawns 3] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.ranks import RankPool  # noqa: E402


def trivial(ctx):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def _spawned_rank(rank: int, world_size: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    dist.destroy_process_group()


def spawn_per_test(world_size: int) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        mp.start_processes(_spawned_rank, args=(world_size, os.path.join(tmp, "store")), nprocs=world_size,
                           join=True, start_method="spawn")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--spawns", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()

    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=args.world_size) as pool:
        started = time.perf_counter()
        pool.run(trivial)
        pool_start = time.perf_counter() - started
        for _ in range(20):  # warm-up
            pool.run(trivial)
        per_call = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            assert pool.run(trivial) == [float(args.world_size)] * args.world_size
            per_call.append(time.perf_counter() - t0)

    spawned = [spawn_per_test(args.world_size) for _ in range(args.spawns)]

    pool_ms = statistics.median(per_call) * 1000
    pool_p99_ms = sorted(per_call)[int(0.99 * (len(per_call) - 1))] * 1000
    spawn_ms = statistics.median(spawned) * 1000
    ratio = spawn_ms / pool_ms
    print(f"world size {args.world_size}, gloo, {os.cpu_count()} cores")
    print(f"pool start (spawn + init + first call): {pool_start * 1000:8.1f} ms")
    print(f"pool call, median of {args.calls}:          {pool_ms:8.2f} ms (p99 {pool_p99_ms:.2f} ms)")
    print(f"spawn-per-test, median of {args.spawns}:         {spawn_ms:8.1f} ms")
    print(f"spawn-per-test / pool call:              {ratio:8.0f}x")
    print(json.dumps({
        "name": "harness_overhead",
        "figures": {"world_size": args.world_size, "pool_start_ms": round(pool_start * 1000, 1),
                    "pool_call_median_ms": round(pool_ms, 3), "pool_call_p99_ms": round(pool_p99_ms, 3),
                    "spawn_per_test_median_ms": round(spawn_ms, 1)},
        "ratio": round(ratio, 1),
    }))


if __name__ == "__main__":
    main()
