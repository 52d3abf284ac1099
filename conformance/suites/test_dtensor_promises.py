"""DTensor promises upstream's own tests check, beyond the ``dtensor`` suite's matrix: gradients through
``redistribute`` (and their placement), ops on ``Partial`` placements (add, sub, scalar mul, neg) reduced
afterwards, a ``_StridedShard`` round trip, uneven sharding on a 2 x 2 mesh (4 ranks), and device-mesh
slicing and flattening (each sub-mesh's group reduces over exactly its ranks), and gradients across
``from_local``/``to_local`` where DTensors meet plain tensors or a gradient is None.

Each check takes ``redistributor`` (or ``grouper``, or ``to_local``/``from_local``/``splitter``), as the
``dtensor`` suite's do.
"""

from __future__ import annotations

import pytest

from conformance import requires, world_size
from conformance.suites import _dtensor_promise_bodies as bodies
from conformance.suites.test_collectives import raise_problems

pytestmark = requires("dtensor")


def _same(got, want, exact=True) -> str | None:
    import torch

    if not isinstance(got, torch.Tensor):
        return f"got {got!r}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if not torch.equal(got, want.to(got.dtype)):
        first = (got != want.to(got.dtype)).nonzero()[0].tolist()
        return f"differs first at {tuple(first)}: got {got[tuple(first)].item()}, expected {want[tuple(first)].item()}"
    return None


def check_backward(ranks, src, dst, redistributor="dtensor"):
    world = ranks.world_size
    results = ranks.run(bodies.backward_through_redistribute_on_rank, src, dst, redistributor=redistributor)
    want = bodies.full_input(4 * world, 2 * world, 3)
    problems = []
    for rank, record in enumerate(results):
        if "error" in record:
            problems.append(f"rank {rank}: raised {record['error']}")
        elif record["grad"] is None:
            problems.append(f"rank {rank}: x.grad is None after backward")
        else:
            if (problem := _same(record["grad"], want)) is not None:
                problems.append(f"rank {rank}: x.grad (in full): {problem}")
            if record["placements"] != [str(bodies.placement(src))]:
                problems.append(f"rank {rank}: x.grad is placed {record['placements']}, not as x ({src})")
    raise_problems(problems, f"DTensor backward through redistribute {src} -> {dst} over {ranks.backend}")


@pytest.mark.parametrize("src,dst", [("S0", "R"), ("R", "S1"), ("S1", "S0")])
def test_backward_through_redistribute(ranks, src, dst):
    check_backward(ranks, src, dst)


def check_partial_ops(ranks, redistributor="dtensor"):
    results = ranks.run(bodies.partial_ops_on_rank, redistributor=redistributor)
    locals_ = [bodies.partial_locals(r) for r in range(ranks.world_size)]
    a, b = (sum(pair[i] for pair in locals_) for i in (0, 1))
    want = {"add": a + b, "sub": a - b, "mul_by_scalar": a * 3, "neg": -a}
    problems = [f"rank {rank}: {op} of Partial(sum) DTensors, reduced: {problem}"
                for rank, record in enumerate(results) for op in bodies.PARTIAL_OPS
                if (problem := _same(record[op], want[op])) is not None]
    raise_problems(problems, f"DTensor ops on Partial placements over {ranks.backend}")


def test_ops_on_partial(ranks):
    check_partial_ops(ranks)


def check_strided_shard(ranks, split_factor, redistributor="dtensor"):
    import torch

    world = ranks.world_size
    results = ranks.run(bodies.strided_shard_on_rank, split_factor, redistributor=redistributor)
    if isinstance(results[0], str):
        pytest.skip(results[0])
    full = bodies.full_input(split_factor * world * 2, 3)
    problems = []
    for rank, record in enumerate(results):
        if "error" in record:
            problems.append(f"rank {rank}: raised {record['error']}")
            continue
        # Split into split_factor pieces, each sharded over the ranks: a rank holds its part of every piece.
        local = torch.cat([piece.chunk(world)[rank] for piece in full.chunk(split_factor)])
        for what, got, want in (("local shard", record["local"], local), ("round trip to Replicate", record["round_trip"], full)):
            if (problem := _same(got, want)) is not None:
                problems.append(f"rank {rank}: {what}: {problem}")
    raise_problems(problems, f"DTensor _StridedShard(0, split_factor={split_factor}) over {ranks.backend}")


@pytest.mark.parametrize("split_factor", [2, 3])
def test_strided_shard(ranks, split_factor):
    check_strided_shard(ranks, split_factor)


def check_uneven_2d(ranks, rows, cols, redistributor="dtensor"):
    full = bodies.full_input(rows, cols)
    results = ranks.run(bodies.uneven_2d_on_rank, rows, cols, redistributor=redistributor)
    problems = []
    for rank, record in enumerate(results):
        if "error" in record:
            problems.append(f"rank {rank}: raised {record['error']}")
            continue
        i, j = record["coordinate"]
        local = full.chunk(2, 0)[i].chunk(2, 1)[j] if i < len(full.chunk(2, 0)) else full[:0]
        for what, got, want in (("local shard", record["local"], local), ("round trip to Replicate", record["round_trip"], full)):
            if (problem := _same(got, want)) is not None:
                problems.append(f"rank {rank} (mesh coordinate {i}, {j}): {what}: {problem}")
    raise_problems(problems, f"DTensor [Shard(0), Shard(1)] of {rows} x {cols} on a 2 x 2 mesh over {ranks.backend}")


@world_size(4)
@pytest.mark.parametrize("rows,cols", [(5, 3), (3, 7)])
def test_uneven_sharding_2d_mesh(ranks, rows, cols):
    check_uneven_2d(ranks, rows, cols)


def check_mesh_slices(ranks, grouper="dtensor"):
    results = ranks.run(bodies.mesh_slices_on_rank, grouper=grouper)
    if isinstance(results[0], str):
        pytest.skip(results[0])
    problems = []
    for rank, record in enumerate(results):
        for name in ("dp", "tp", "dp_tp"):
            got = record[name]
            want_sum = float(sum(r + 1 for r in got["ranks"]))
            if rank not in got["ranks"]:
                problems.append(f"rank {rank}: mesh[{name!r}] holds ranks {got['ranks']}, not this one")
            elif got["sum"] != want_sum:
                problems.append(f"rank {rank}: all_reduce over mesh[{name!r}]'s group (ranks {got['ranks']}) gave "
                                f"{got['sum']}, expected {want_sum}")
        if record["dp_tp"]["size"] != ranks.world_size:
            problems.append(f"rank {rank}: the flattened ('dp', 'tp') mesh has size {record['dp_tp']['size']}")
    raise_problems(problems, f"device-mesh slicing and flattening of a {tuple(results[0]['shape'])} mesh over "
                             f"{ranks.backend}")


def test_mesh_slicing_and_flattening(ranks):
    check_mesh_slices(ranks)


def check_local_gradients(ranks, case, to_local="dtensor", from_local="dtensor", splitter="dtensor"):
    results = ranks.run(bodies.local_gradients_on_rank, case, to_local=to_local, from_local=from_local,
                        splitter=splitter)
    wants = bodies.local_gradients_expected(case, ranks.world_size)
    problems = []
    for rank, record in enumerate(results):
        if "error" in record:
            problems.append(f"rank {rank}: backward raised {record['error']}")
            continue
        for name, got, want in zip(bodies.LOCAL_GRADIENT_CASES[case], record["grads"], wants):
            if want is None and got is not None:
                problems.append(f"rank {rank}: {name} gradient should be None (allow_unused), got {got!r}")
            elif want is not None and got is None:
                problems.append(f"rank {rank}: {name} gradient is None after backward")
            elif want is not None and (problem := _same(got, want)) is not None:
                problems.append(f"rank {rank}: {name} gradient: {problem}")
    raise_problems(problems, f"DTensor gradients across from_local/to_local ({case}) over {ranks.backend}")


@pytest.mark.parametrize("case", list(bodies.LOCAL_GRADIENT_CASES))
def test_gradients_across_from_local_and_to_local(ranks, case):
    check_local_gradients(ranks, case)
