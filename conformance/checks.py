"""Assertions for per-rank results, with messages that name the backend, the rank and the operation.

Used by the suites in the controller process, on the CPU tensors that ``ranks.run`` returns.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["ConformanceFailure", "assert_close", "assert_ranks_equal", "tolerance"]


class ConformanceFailure(AssertionError):
    """A backend returned a wrong value; the message says which rank, which operation, and how."""


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing ``dtype`` results against a reference computed in float32/64."""
    import torch

    return {
        torch.float16: (1e-3, 1e-3),
        torch.bfloat16: (1.6e-2, 1e-2),
        torch.float32: (1.3e-6, 1e-5),
        torch.float64: (1e-7, 1e-7),
    }.get(dtype, (0.0, 0.0))


def _diff(actual, expected) -> str:
    import torch

    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    mismatch = (actual != expected) if not actual.is_floating_point() else ~torch.isclose(
        actual.double(), expected.double(), *tolerance(actual.dtype), equal_nan=True)
    idx = mismatch.nonzero()
    first = tuple(idx[0].tolist()) if len(idx) else ()
    shown_a = actual.flatten()[:8].tolist()
    shown_e = expected.flatten()[:8].tolist()
    return (f"{int(mismatch.sum())} of {actual.numel()} elements differ, first at index {first}: "
            f"got {actual[first].item() if first else actual.flatten()[0].item()!r}, "
            f"expected {expected[first].item() if first else expected.flatten()[0].item()!r}; "
            f"got {shown_a}..., expected {shown_e}...")


def assert_close(actual, expected, *, what: str, rank: int | None = None, exact: bool = False) -> None:
    """Compare one tensor with tolerances for its dtype (or bitwise when ``exact``)."""
    import torch

    where = f"rank {rank}: " if rank is not None else ""
    ok = actual.shape == expected.shape and actual.dtype == expected.dtype
    if ok:
        if exact or not actual.is_floating_point():
            ok = torch.equal(actual, expected) or (
                actual.is_floating_point() and torch.equal(actual.isnan(), expected.isnan())
                and torch.equal(actual.nan_to_num(), expected.nan_to_num()))
        else:
            rtol, atol = tolerance(actual.dtype)
            ok = torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)
    if not ok:
        raise ConformanceFailure(f"{where}{what} is wrong: {_diff(actual, expected)}")


def assert_ranks_equal(results: Sequence[Any], expected: Sequence[Any] | Any, *, what: str,
                       exact: bool = False) -> None:
    """Every rank's result equals its expected value (one per rank, or one shared by all)."""
    per_rank = expected if isinstance(expected, (list, tuple)) else [expected] * len(results)
    if len(per_rank) != len(results):
        raise ConformanceFailure(f"{what}: {len(results)} rank results but {len(per_rank)} expected values")
    failures = []
    for rank, (actual, wanted) in enumerate(zip(results, per_rank)):
        try:
            assert_close(actual, wanted, what=what, rank=rank, exact=exact)
        except ConformanceFailure as exc:
            failures.append(str(exc))
    if failures:
        raise ConformanceFailure("\n".join(failures))
