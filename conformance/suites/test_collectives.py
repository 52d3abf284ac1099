"""Plain collectives over the backend's process group, checked against values computed locally.

The matrix is every reduce op x every dtype for which torch defines the op: bitwise ops on integral
and bool dtypes, arithmetic ops on numbers. Bitwise ops on floating dtypes are not dropped: a backend
must refuse them with an error (``test_all_reduce_rejects_undefined``), never return garbage.
Combinations a backend cannot do (gloo: PREMUL_SUM, AVG on integers) are listed as known failures
in its descriptor, with the reason, so they stay visible as xfailed and turn red once fixed.

Inputs differ per rank so that ordering bugs (rank i's data landing in rank j's slot) show up.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from conformance import assert_ranks_equal, requires

pytestmark = requires("collectives")

FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["int8", "uint8", "int32", "int64"]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ["bool"]
ARITHMETIC_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"]
BITWISE_OPS = ["BAND", "BOR", "BXOR"]
PREMUL_FACTOR = 2.0


def _dtype_param(name: str):
    return pytest.param(name, marks=requires("bf16")) if name == "bfloat16" else name


def _reduce_cases():
    for op in ARITHMETIC_OPS:
        dtypes = FLOAT_DTYPES if op == "PREMUL_SUM" else FLOAT_DTYPES + INT_DTYPES
        dtypes = dtypes + (["bool"] if op in ("SUM", "PRODUCT", "MIN", "MAX") else [])
        for dtype in dtypes:
            marks = [requires("bf16")] if dtype == "bfloat16" else []
            yield pytest.param(op, dtype, marks=marks, id=f"{op}-{dtype}")
    for op in BITWISE_OPS:
        for dtype in INT_DTYPES + ["bool"]:
            yield pytest.param(op, dtype, id=f"{op}-{dtype}")


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def rank_input(rank: int, numel: int, dtype_name: str, *, small: bool = False, device=None):
    """Deterministic, rank-dependent input on ``device``; ``small`` keeps products of world-size factors
    in range. Rank functions pass ``ctx.device``; the controller's references use its default (cpu)."""
    import torch

    idx = torch.arange(numel, device=device)
    if dtype_name == "bool":
        return (idx + rank) % 3 == 0
    values = (idx + rank) % 2 + 1 if small else (idx + 3 * rank) % 5 + 1
    return values.to(_dtype(dtype_name))


def _reduce_op(op: str):
    import torch.distributed as dist

    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def expected_reduction(op: str, inputs: list):
    """What all_reduce(op) must give, computed locally from every rank's input."""
    import torch

    dtype, stacked = inputs[0].dtype, torch.stack(inputs)
    if op == "SUM":
        return stacked.sum(0).to(dtype) if dtype != torch.bool else stacked.any(0)
    if op == "PRODUCT":
        return stacked.prod(0).to(dtype) if dtype != torch.bool else stacked.all(0)
    if op == "MIN":
        return stacked.min(0).values
    if op == "MAX":
        return stacked.max(0).values
    if op == "AVG":
        if dtype.is_floating_point:
            return (stacked.double().sum(0) / len(inputs)).to(dtype)
        return torch.div(stacked.sum(0), len(inputs), rounding_mode="trunc").to(dtype)
    if op == "PREMUL_SUM":
        return (stacked.double() * PREMUL_FACTOR).sum(0).to(dtype)
    bitwise = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    return functools.reduce(bitwise, inputs)


# -- functions that run on every rank -------------------------------------------------------------

def all_reduce_on_rank(ctx, op: str, dtype_name: str, numel: int):
    import torch.distributed as dist

    tensor = rank_input(ctx.rank, numel, dtype_name, small=op == "PRODUCT", device=ctx.device)
    dist.all_reduce(tensor, op=_reduce_op(op))
    return tensor


def all_reduce_error_on_rank(ctx, op: str, dtype_name: str):
    import torch.distributed as dist

    tensor = rank_input(ctx.rank, 8, dtype_name, device=ctx.device)
    try:
        dist.all_reduce(tensor, op=_reduce_op(op))
    except (RuntimeError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def all_gather_on_rank(ctx, dtype_name: str, numel: int):
    import torch
    import torch.distributed as dist

    local = rank_input(ctx.rank, numel, dtype_name, device=ctx.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out = torch.empty(numel * ctx.world_size, dtype=local.dtype, device=ctx.device)
    gather(out, local)
    listed = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(listed, local)
    return out, torch.cat(listed)


def reduce_scatter_on_rank(ctx, dtype_name: str, chunk: int):
    import torch
    import torch.distributed as dist

    full = rank_input(ctx.rank, chunk * ctx.world_size, dtype_name, device=ctx.device)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = torch.empty(chunk, dtype=full.dtype, device=ctx.device)
    scatter(out, full, op=dist.ReduceOp.SUM)
    return out


def a2a_payload(src: int, dst: int, count: int, dtype_name: str, device=None):
    """What rank ``src`` sends to rank ``dst`` in the uneven all_to_all: ``src + dst + 1`` elements."""
    import torch

    idx = torch.arange(count, device=device)
    if dtype_name == "bool":
        return (idx + src + dst) % 2 == 0
    return ((src * 7 + dst * 3 + idx) % 11).to(_dtype(dtype_name))


def all_to_all_on_rank(ctx, dtype_name: str):
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    send_sizes = [rank + dst + 1 for dst in range(world)]
    recv_sizes = [src + rank + 1 for src in range(world)]
    send = torch.cat([a2a_payload(rank, dst, n, dtype_name, ctx.device) for dst, n in enumerate(send_sizes)])
    recv = torch.empty(sum(recv_sizes), dtype=send.dtype, device=ctx.device)
    dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
    return recv


def broadcast_on_rank(ctx, dtype_name: str, src: int, numel: int):
    import torch.distributed as dist

    tensor = rank_input(ctx.rank, numel, dtype_name, device=ctx.device)
    dist.broadcast(tensor, src=src)
    return tensor


def barrier_on_rank(ctx, round_id: int):
    import time

    import torch.distributed as dist

    marker_dir = Path(ctx.shared_dir) / f"barrier-{round_id}"
    marker_dir.mkdir(exist_ok=True)
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.2)  # the last rank arrives late: nobody may pass the barrier before it does
    (marker_dir / f"rank{ctx.rank}").write_text(str(os.getpid()))
    dist.barrier()
    return sorted(p.name for p in marker_dir.iterdir())


# -- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, dtype_name", list(_reduce_cases()))
def test_all_reduce(ranks, op, dtype_name):
    numel = 33  # odd, so no backend can hide a bug behind vectorised halves
    results = ranks.run(all_reduce_on_rank, op, dtype_name, numel)
    inputs = [rank_input(r, numel, dtype_name, small=op == "PRODUCT") for r in range(ranks.world_size)]
    assert_ranks_equal(results, expected_reduction(op, inputs),
                       what=f"all_reduce({op}) on {dtype_name} over {ranks.backend}")


@pytest.mark.parametrize("op", BITWISE_OPS)
@pytest.mark.parametrize("dtype_name", [_dtype_param(d) for d in FLOAT_DTYPES])
def test_all_reduce_rejects_undefined(ranks, op, dtype_name):
    """Bitwise reductions of floating-point tensors have no meaning: every rank must get an error."""
    errors = ranks.run(all_reduce_error_on_rank, op, dtype_name)
    silent = [rank for rank, err in enumerate(errors) if err is None]
    assert not silent, (f"all_reduce({op}) on {dtype_name} over {ranks.backend} returned a value on rank "
                        f"{silent} instead of raising (bitwise ops are undefined on floating point)")


@pytest.mark.parametrize("dtype_name", [_dtype_param(d) for d in ALL_DTYPES])
def test_all_gather(ranks, dtype_name):
    numel = 5
    results = ranks.run(all_gather_on_rank, dtype_name, numel)
    import torch

    expected = torch.cat([rank_input(r, numel, dtype_name) for r in range(ranks.world_size)])
    assert_ranks_equal([single for single, _ in results], expected,
                       what=f"all_gather into one tensor on {dtype_name} over {ranks.backend}")
    assert_ranks_equal([listed for _, listed in results], expected,
                       what=f"all_gather into a tensor list on {dtype_name} over {ranks.backend}")


@pytest.mark.parametrize("dtype_name", [_dtype_param(d) for d in FLOAT_DTYPES + INT_DTYPES])
def test_reduce_scatter(ranks, dtype_name):
    chunk, world = 3, ranks.world_size
    results = ranks.run(reduce_scatter_on_rank, dtype_name, chunk)
    total = expected_reduction("SUM", [rank_input(r, chunk * world, dtype_name) for r in range(world)])
    assert_ranks_equal(results, list(total.split(chunk)),
                       what=f"reduce_scatter(SUM) on {dtype_name} over {ranks.backend}")


@pytest.mark.parametrize("dtype_name", [_dtype_param(d) for d in ALL_DTYPES])
def test_all_to_all_uneven(ranks, dtype_name):
    import torch

    world = ranks.world_size
    results = ranks.run(all_to_all_on_rank, dtype_name)
    expected = [torch.cat([a2a_payload(src, dst, src + dst + 1, dtype_name) for src in range(world)])
                for dst in range(world)]
    assert_ranks_equal(results, expected,
                       what=f"all_to_all_single with uneven splits on {dtype_name} over {ranks.backend}")


@pytest.mark.parametrize("source", ["first", "last"])
@pytest.mark.parametrize("dtype_name", [_dtype_param(d) for d in ALL_DTYPES])
def test_broadcast(ranks, dtype_name, source):
    src = 0 if source == "first" else ranks.world_size - 1
    results = ranks.run(broadcast_on_rank, dtype_name, src, 7)
    assert_ranks_equal(results, rank_input(src, 7, dtype_name),
                       what=f"broadcast from rank {src} on {dtype_name} over {ranks.backend}")


def test_barrier(ranks):
    import uuid

    seen = ranks.run(barrier_on_rank, uuid.uuid4().int % 10**9)
    everyone = sorted(f"rank{r}" for r in range(ranks.world_size))
    for rank, names in enumerate(seen):
        assert names == everyone, (f"rank {rank} passed the barrier over {ranks.backend} before every rank "
                                   f"arrived: saw {names}, expected {everyone}")
