"""Checking typed programs' results, in the controller: ``Check`` records against their references.

Triggered by ``test_typed_collectives`` (and the project's own tests) with what the rank functions
of ``_typed_programs`` returned, one list of ``Check`` per rank. ``verify_checks`` raises one
``ConformanceFailure`` naming the program, the rank and every tensor that is wrong (R gradients
summed over the ranks that hold them first); ``verify_rejection`` does the same for programs the
checker must refuse. Reads nothing else, writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.checks import ConformanceFailure

__all__ = ["Check", "PROGRAM_TOLERANCE", "verify_checks", "verify_rejection"]

# Relative tolerance per dtype for whole programs (several rounded ops) against a float64 reference;
# the absolute tolerance is the same figure scaled by the reference's magnitude.
PROGRAM_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}


@dataclass
class Check:
    """One value a rank computed and the value it must equal.

    ``summed_over`` names ranks whose values must *sum* to ``expected`` (the gradient of an R
    parameter is Partial); ``must_differ`` turns the check around (a program with a deliberate bug
    must give a wrong value, or the test proves nothing); ``exact`` asks for bitwise equality.
    """

    what: str
    actual: Any
    expected: Any
    summed_over: tuple[int, ...] | None = None
    must_differ: bool = False
    exact: bool = False


# -- checking, in the controller ------------------------------------------------------------------

def _mismatch(actual, expected, rtol: float, exact: bool) -> str | None:
    """None when ``actual`` matches; else a one-line description of the first difference."""
    import torch

    actual, expected = torch.as_tensor(actual).detach(), torch.as_tensor(expected).detach()
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a, e = actual.double(), expected.double()
    if exact:
        bad = a != e
    else:
        scale = max(1.0, float(e.abs().max())) if e.numel() else 1.0
        bad = (a - e).abs() > rtol * e.abs() + rtol * scale
    if not bool(bad.any()):
        return None
    index = tuple(bad.nonzero()[0].tolist())
    worst = float((a - e).abs().max())
    return (f"{int(bad.sum())} of {a.numel()} elements differ (largest difference {worst:.3g}), first at "
            f"{index}: got {a[index].item():.6g}, expected {e[index].item():.6g}")


def verify_checks(per_rank: list[list[Check]], *, what: str, dtype_name: str = "float32") -> None:
    """Raise one ConformanceFailure listing every Check that failed on any rank."""
    rtol = PROGRAM_TOLERANCE.get(dtype_name, 1e-4)
    failures: list[str] = []
    for index, first in enumerate(per_rank[0]):
        if first.summed_over is not None:
            groups = {tuple(per_rank[rank][index].summed_over) for rank in range(len(per_rank))}
            for group in sorted(groups):
                total = sum(per_rank[rank][index].actual.double() for rank in group)
                problem = _mismatch(total, per_rank[group[0]][index].expected, rtol, first.exact)
                if problem:
                    failures.append(f"ranks {list(group)} summed: {first.what}: {problem}")
            continue
        for rank, checks in enumerate(per_rank):
            check = checks[index]
            problem = _mismatch(check.actual, check.expected, rtol, check.exact)
            if check.must_differ and problem is None:
                failures.append(f"rank {rank}: {check.what}: equals the reference, but this program is "
                                "deliberately wrong, so the check proves nothing")
            elif not check.must_differ and problem:
                failures.append(f"rank {rank}: {check.what}: {problem}")
    if failures:
        raise ConformanceFailure(f"{what} is wrong:\n  " + "\n  ".join(failures))


def verify_rejection(per_rank: list[str | None], *, what: str, error_type: str, parts: tuple[str, ...]) -> None:
    """Every rank must have raised ``error_type`` with a message containing each of ``parts``."""
    failures = []
    for rank, error in enumerate(per_rank):
        if error is None:
            failures.append(f"rank {rank}: the program ran; it must be rejected with {error_type}")
            continue
        kind, _, message = error.partition(": ")
        missing = [p for p in parts if p not in message]
        if kind != error_type or missing:
            failures.append(f"rank {rank}: expected {error_type} mentioning {list(parts)}, got {kind}: "
                            f"{message.splitlines()[0][:300] if message else ''}"
                            + (f" (missing {missing})" if missing else ""))
    if failures:
        raise ConformanceFailure(f"{what}:\n  " + "\n  ".join(failures))
