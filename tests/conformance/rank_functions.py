"""Module-level functions the harness tests run on ranks (rank processes import them by name)."""

import ctypes
import json
import operator
import os
import signal
import sys
import time


def rank_only(ctx):
    """Nothing but the round trip (bench/rank_call_latency.py)."""
    return ctx.rank


def rank_and_sum(ctx, offset):
    import torch
    import torch.distributed as dist

    t = torch.tensor([ctx.rank + offset], device=ctx.device)
    dist.all_reduce(t)
    return ctx.rank, ctx.world_size, str(ctx.device), ctx.backend, int(t.item()), os.getpid()


def raise_on_ranks(ctx, failing):
    if ctx.rank in failing:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    return ctx.rank


def raise_before_collective(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        raise RuntimeError("rank 0 gave up before the all_reduce")
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t)  # blocks: rank 0 never joins
    return t


def exit_hard(ctx, rank, code):
    if ctx.rank == rank:
        os._exit(code)
    time.sleep(60)


def segfault(ctx, rank):
    if ctx.rank == rank:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(60)


def abort_deep_in_a_stack(ctx, rank, depth=40):
    """Print a line as glibc does before it aborts, then abort under ``depth`` Python frames, so
    faulthandler's stack is longer than the output a crash report keeps."""
    if depth:
        return abort_deep_in_a_stack(ctx, rank, depth - 1)
    if ctx.rank == rank:
        print("malloc(): pretend heap corruption detected", flush=True)
        os.abort()
    time.sleep(60)


def fatal_then_hang(ctx):
    """Rank 1 logs a fatal error and never exits (a rank stuck on its way out); rank 0 raises."""
    if ctx.rank == 1:
        print("Fatal Python error: Segmentation fault", flush=True)
        time.sleep(3600)
    raise RuntimeError("peer lost")


def sleep_forever(ctx):
    time.sleep(3600)


def print_then_crash(ctx):
    if ctx.rank == 1:
        print("last words of rank 1", flush=True)
        ctypes.string_at(0)  # a real segfault, not a signal sent by hand
    time.sleep(60)


def shared_dir_roundtrip(ctx):
    from pathlib import Path

    Path(ctx.shared_dir, f"r{ctx.rank}").write_text(str(ctx.rank))
    import torch.distributed as dist

    dist.barrier()
    return sorted(p.name for p in Path(ctx.shared_dir).iterdir())


def forgetful_all_reduce(ctx):
    """A body that forgets ``ctx.device``: right on a CPU rank by accident, wrong on any accelerator."""
    import torch
    import torch.distributed as dist

    t = torch.full((4,), float(ctx.rank))
    dist.all_reduce(t)
    return t


def forgetful_result(ctx):
    """Forgets the device but runs no collective: the tensor it returns is where it was made."""
    import torch

    return torch.arange(3) + ctx.rank


def faithful_all_reduce(ctx):
    import torch
    import torch.distributed as dist

    t = torch.full((4,), float(ctx.rank), device=ctx.device)
    dist.all_reduce(t)
    return t, str(torch.empty(0).device)


class UnpicklableHere:
    """Pickles on the rank; unpickling it raises (as a class only the rank can import would)."""

    def __reduce__(self):
        return (operator.truediv, (1, 0))


def unreadable_on(ctx, rank):
    return UnpicklableHere() if ctx.rank == rank else ("fresh", ctx.rank)


def send_a_late_reply(ctx, call):
    """Rank 0 first sends a result numbered ``call`` down its own channel, as a reply to an earlier call
    that ended early would arrive; then every rank answers this call."""
    if ctx.rank == 0:
        from multiprocessing.connection import Connection

        from conformance.ranks import protocol

        channel = Connection(os.dup(json.loads(sys.argv[1])["fd"]))
        protocol.send(channel, protocol.RESULT, call=call, value="late")
        channel.close()
    return ("fresh", ctx.rank)
