"""Typed collectives: spmd-types programs over the backend's real process group, checked against a
single-process reference on the full tensors.

Four layers, from the bottom up, so that a failure names the smallest thing that is wrong:

* ``test_functional_collective[<collective>-<forward|backward>-<dtype>]``: torch's functional
  collectives with autograd (all_reduce, all_gather, reduce_scatter, uneven all_to_all). A failure
  here reads "collective X is wrong on this backend".
* ``test_typed_collective[<collective(src->dst)>-<dtype>]``: spmd-types' typed collectives, forward
  and backward, against their spec.
* ``test_program[<program>-<dtype>]``: whole programs (tensor, sequence, data, FSDP, context and
  expert parallel, vocab-parallel loss, Partial algebra, a regulariser) run under the checker:
  outputs and every gradient equal the reference (V gradients: the reference slice; I gradients:
  the reference on every rank; R gradients: summed over ranks, the reference). The ``dp_x_tp``
  variants run on a 2 x 2 mesh and need 4 ranks.
* ``test_rejected[<program>]``: programs the checker must refuse, with the specific error.

Every collective is reached through ``_collective_impls`` so the project's tests can substitute a
broken one and show that these tests catch it. See docs/suites.md, "Typed collectives and DTensor argmax/argmin".
"""

from __future__ import annotations

import pytest

from conformance import requires, world_size
from conformance.suites import _typed_programs as programs
from conformance.suites._typed_checks import verify_checks, verify_rejection

pytestmark = requires("collectives")

DTYPES = ["float32", pytest.param("bfloat16", marks=requires("bf16"))]


# -- checks: one per layer; ``impl`` names the CollectiveSet under test (see _collective_impls) -------

def check_functional_collective(ranks, collective: str, direction: str, dtype_name: str, *,
                                impl: str = "torch") -> None:
    results = ranks.run(programs.run_raw_collective, collective, dtype_name, impl=impl)
    pick = 0 if direction == "forward" else 1
    verify_checks([[checks[pick]] for checks in results], dtype_name=dtype_name,
                           what=f"functional collective {collective} ({direction}, {dtype_name}) on {ranks.backend}")


def check_typed_collective(ranks, primitive: str, dtype_name: str, *, impl: str = "torch") -> None:
    results = ranks.run(programs.run_primitive, primitive, dtype_name, impl=impl)
    verify_checks(results, dtype_name=dtype_name,
                           what=f"typed collective {primitive} on {dtype_name} over {ranks.backend}")


def check_program(ranks, program: str, dtype_name: str, *, impl: str = "torch", mesh: str = "1d") -> None:
    results = ranks.run(programs.run_program, program, dtype_name, impl=impl, mesh=mesh)
    where = "a 2 x 2 dp x tp mesh" if mesh == "dp_x_tp" else f"{ranks.world_size} ranks"
    verify_checks(results, dtype_name=dtype_name,
                           what=f"typed program {program} on {dtype_name}, {where} over {ranks.backend}")


def check_rejected(ranks, program: str, *, impl: str = "torch") -> None:
    _, error_type, parts = programs.REJECTED[program]
    errors = ranks.run(programs.run_rejected, program, impl=impl)
    verify_rejection(errors, error_type=error_type, parts=parts,
                              what=f"typed program {program} over {ranks.backend} must be rejected")


# -- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("collective", programs.RAW_COLLECTIVES)
def test_functional_collective(ranks, collective, direction, dtype_name):
    check_functional_collective(ranks, collective, direction, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("primitive", programs.PRIMITIVES)
def test_typed_collective(ranks, primitive, dtype_name):
    check_typed_collective(ranks, primitive, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("program", list(programs.PROGRAMS))
def test_program(ranks, program, dtype_name):
    check_program(ranks, program, dtype_name)


@world_size(4)
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("program", sorted(programs.MESH_PROGRAMS))
def test_program_dp_x_tp(ranks, program, dtype_name):
    check_program(ranks, program, dtype_name, mesh="dp_x_tp")


@pytest.mark.parametrize("program", list(programs.REJECTED))
def test_rejected(ranks, program):
    check_rejected(ranks, program)
