"""Uneven and coalesced collectives called directly: list ``all_gather`` with a different size on every
rank, and the process group's ``allgather_into_tensor_coalesced`` and ``reduce_scatter_tensor_coalesced``
on tensors of different sizes (each call waited before the next: docs/known-bugs.md, item 18).

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires
from conformance.suites import _collective_data as data
from conformance.suites import _uneven_coalesced_bodies as bodies
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]

DTYPES = [pytest.param(d, marks=[requires("bf16")] if d == "bfloat16" else []) for d in ("float32", "bfloat16", "int64")]


def check_uneven_all_gather(ranks, dtype, impl="torch"):
    import torch

    salt, world = f"uneven_all_gather/{dtype}", ranks.world_size
    results = data.run_packed(ranks, bodies.uneven_all_gather_on_rank, salt, dtype, impl=impl)
    want = [data.payload(salt, r, bodies.uneven_size(r), dtype) for r in range(world)]
    problems = []
    for rank, got in enumerate(results):
        if isinstance(got, str):
            problems.append(f"rank {rank}: raised {got}")
            continue
        for src, (piece, expected) in enumerate(zip(got, want)):
            if (problem := data.same_bits(piece, expected)) is not None:
                problems.append(f"rank {rank}: the {bodies.uneven_size(src)} elements from rank {src}: {problem}")
    sizes = [bodies.uneven_size(r) for r in range(world)]
    raise_problems(problems, f"all_gather of uneven sizes {sizes} on {dtype} over {ranks.backend}")
    del torch


@pytest.mark.parametrize("dtype", DTYPES)
def test_uneven_all_gather(ranks, dtype):
    check_uneven_all_gather(ranks, dtype)


def check_coalesced_direct(ranks, dtype, impl="torch"):
    import torch

    salt, world = f"coalesced_direct/{dtype}", ranks.world_size
    results = data.run_packed(ranks, bodies.coalesced_direct_on_rank, salt, dtype, impl=impl)
    sizes = bodies.COALESCED_SIZES
    gathered = [torch.cat([data.payload(f"{salt}/ag{i}", r, n, dtype) for r in range(world)])
                for i, n in enumerate(sizes)]
    summed = [data.expected_reduction("SUM", [data.reduce_input(f"{salt}/rs{i}", r, n * world, dtype, "SUM")
                                               for r in range(world)]) for i, n in enumerate(sizes)]
    problems = []
    for rank, got in enumerate(results):
        wants = {"allgather_into_tensor_coalesced": gathered,
                 "reduce_scatter_tensor_coalesced": [s.split(n)[rank] for s, n in zip(summed, sizes)]}
        for name, want in wants.items():
            if isinstance(got[name], str):
                problems.append(f"rank {rank}: {name} raised {got[name]}")
                continue
            for i, (piece, expected) in enumerate(zip(got[name], want)):
                if (problem := data.same_bits(piece, expected)) is not None:
                    problems.append(f"rank {rank}: {name}: tensor {i} of {len(sizes)} ({sizes[i]} per rank): {problem}")
    raise_problems(problems, f"coalesced collectives called directly on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_coalesced_direct(ranks, dtype):
    check_coalesced_direct(ranks, dtype)
