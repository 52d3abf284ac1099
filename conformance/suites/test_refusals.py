"""Refusals: a reduction on float8 (e4m3fn, e5m2) must either raise (gloo, NCCL before float8 support:
"Invalid scalar type", "Float8 dtypes are not currently supported") or give the exact result, never
garbage; the same for all_reduce on every float8 dtype with SUM, MIN and MAX.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires
from conformance.suites import _collective_data as data
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]

VALUES = (0.5, 1.0, 1.5, 2.0, -0.25, 0.0, 3.0, -1.0)  # exact in both float8 formats, and their sums on 2-4 ranks


@data.packed
def float8_reduction_on_rank(ctx, dtype: str, op: str, impl: str = "torch"):
    """``("raised", error)`` or ``("returned", tensor)``."""
    import torch

    from conformance.suites._collective_bodies import _error, reduce_op
    from conformance.suites._collective_impls import resolve_dist

    dist = resolve_dist(impl)
    with torch.device("cpu"):
        values = torch.tensor(VALUES, dtype=torch.float32).roll(ctx.rank)
    tensor = values.to(getattr(torch, dtype)).to(ctx.device)
    try:
        dist.all_reduce(tensor, op=reduce_op(dist, op))
    except (RuntimeError, ValueError, TypeError) as exc:
        return "raised", _error(exc)
    return "returned", tensor


def check_float8_reduction(ranks, dtype, op, impl="torch"):
    import torch

    results = data.run_packed(ranks, float8_reduction_on_rank, dtype, op, impl=impl)
    inputs = [torch.tensor(VALUES, dtype=torch.float32).roll(r) for r in range(ranks.world_size)]
    want = data.expected_reduction(op, [t.double() for t in inputs]).to(getattr(torch, dtype))
    problems = []
    outcomes = {kind for kind, _ in results}
    if len(outcomes) > 1:
        problems.append("ranks disagree: " + "; ".join(f"rank {r} {kind}" for r, (kind, _) in enumerate(results)))
    for rank, (kind, value) in enumerate(results):
        if kind == "returned" and (problem := data.same_bits(value, want)) is not None:
            problems.append(f"rank {rank}: all_reduce({op}) returned a wrong result instead of raising: {problem}")
    raise_problems(problems, f"all_reduce({op}) on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("op", ["SUM", "MIN", "MAX"])
@pytest.mark.parametrize("dtype", data.FLOAT8_DTYPES)
def test_float8_reduction_raises_or_is_exact(ranks, dtype, op):
    check_float8_reduction(ranks, dtype, op)
