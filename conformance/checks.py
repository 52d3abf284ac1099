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


def _mismatch(actual, expected, exact: bool, tol: tuple[float, float] | None = None):
    """The elements that differ, as a bool tensor: within ``tol`` (rtol, atol; default the dtype's
    tolerance), or exactly when ``exact`` or not floating point; NaN equals NaN either way. Shapes and
    dtypes already agree."""
    import torch

    if exact or not actual.is_floating_point():
        differ = actual != expected
        if actual.is_floating_point():
            differ &= ~(actual.isnan() & expected.isnan())
        return differ
    rtol, atol = tol if tol is not None else tolerance(actual.dtype)
    return ~torch.isclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)


def _diff(actual, expected, exact: bool, tol: tuple[float, float] | None = None) -> str | None:
    """What differs between the tensors, or None when they agree."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    mismatch = _mismatch(actual, expected, exact, tol)
    if not mismatch.any():
        return None
    first = tuple(mismatch.nonzero()[0].tolist())
    more = "..." if actual.numel() > 8 else ""
    return (f"{int(mismatch.sum())} of {actual.numel()} elements differ, first at index {first}: "
            f"got {actual[first].item()!r}, expected {expected[first].item()!r}; "
            f"got {actual.flatten()[:8].tolist()}{more}, expected {expected.flatten()[:8].tolist()}{more}")


def assert_close(actual, expected, *, what: str, rank: int | None = None, exact: bool = False,
                 tol: tuple[float, float] | None = None) -> None:
    """Compare one tensor with tolerances for its dtype, or ``tol`` (rtol, atol), or exactly when ``exact``
    (NaN equals NaN)."""
    problem = _diff(actual, expected, exact, tol)
    if problem is not None:
        where = f"rank {rank}: " if rank is not None else ""
        raise ConformanceFailure(f"{where}{what} is wrong: {problem}")


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
