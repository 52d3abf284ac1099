"""Collectives over the backend's process group, checked against values computed locally.

Reductions (all_reduce, reduce to every dst, reduce_scatter in its tensor, list and uneven forms):
all_reduce with every op x every dtype torch defines it for; reduce and reduce_scatter, which share
its arithmetic, with every op on one dtype per family and every dtype under SUM and MAX; compared exactly (inputs are integer-valued, so every
op but AVG is exact in every dtype; AVG uses the dtype's tolerance). Undefined pairs (bitwise ops on
floats; MIN/MAX/PRODUCT on complex) must raise. NaN and infinities under MIN/MAX/SUM propagate as
in eager torch.

Data movement (broadcast from every src, all_gather tensor and list, gather to every dst, scatter from
every src, all_to_all single and list with even, uneven and zero-sized splits): every dtype, floats8
and complex included, each input led by its dtype's edge values and filled with random bit patterns,
compared bit for bit. Then the coalesced forms, ``async_op=True`` handles (wait, is_completed,
get_future), object collectives and a barrier.

Inputs differ per rank with no period (``_collective_data``). Every check takes ``impl``, the API it
calls (``_collective_impls.resolve_dist``): ``tests/conformance/suites/test_collectives_catches.py`` hands it
broken collectives and shows each caught. What a backend cannot do is a known failure in its
descriptor, with the reason.
"""

from __future__ import annotations

import pytest

from conformance import assert_ranks_equal, requires, shared_dir
from conformance.checks import ConformanceFailure
from conformance.suites import _collective_bodies as bodies
from conformance.suites import _collective_data as data

pytestmark = requires("collectives")


def _param(*values, dtype: str):
    marks = [requires("bf16")] if dtype == "bfloat16" else []
    return pytest.param(*values, marks=marks, id="-".join(str(v) for v in values))


def _dtype_params(dtypes):
    return [_param(d, dtype=d) for d in dtypes]


def raise_problems(problems: list[str], what: str) -> None:
    """One ConformanceFailure listing every rank's problem (the shared message format of these suites)."""
    if problems:
        raise ConformanceFailure(f"{what} is wrong:\n  " + "\n  ".join(problems))


def assert_bits(results: list, expected: list, what: str) -> None:
    """Each rank's tensor equals its expected one bit for bit (None expected: nothing to check)."""
    problems = []
    for rank, (got, want) in enumerate(zip(results, expected)):
        if want is None:
            continue
        problem = data.same_bits(got, want)
        if problem:
            problems.append(f"rank {rank}: {problem}")
    raise_problems(problems, what)


# -- reductions -------------------------------------------------------------------------------------

NUMEL = 33  # odd, so no backend can hide a bug behind vectorised halves


def _inputs(salt, op, dtype, numel, world):
    return [data.reduce_input(salt, r, numel, dtype, op) for r in range(world)]


def check_all_reduce(ranks, op, dtype, impl="torch"):
    salt = f"all_reduce/{op}/{dtype}"
    results = data.run_packed(ranks, bodies.all_reduce_on_rank, salt, op, dtype, NUMEL, impl=impl)
    expected = data.expected_reduction(op, _inputs(salt, op, dtype, NUMEL, ranks.world_size))
    assert_ranks_equal(results, expected, exact=data.reduction_is_exact(op),
                       what=f"all_reduce({op}) on {dtype} over {ranks.backend}")


def check_reduce(ranks, op, dtype, impl="torch"):
    salt = f"reduce/{op}/{dtype}"
    world = ranks.world_size
    per_rank = data.run_packed(ranks, bodies.reduce_on_rank, salt, op, dtype, NUMEL, impl=impl)
    expected = data.expected_reduction(op, _inputs(salt, op, dtype, NUMEL, world))
    for dst in range(world):
        assert_ranks_equal([per_rank[dst][dst]], expected, exact=data.reduction_is_exact(op),
                           what=f"reduce({op}) on {dtype} to dst {dst} over {ranks.backend} (rank numbers: 0 = dst)")


def check_reduce_scatter(ranks, op, dtype, impl="torch"):
    salt, chunk, world = f"reduce_scatter/{op}/{dtype}", 3, ranks.world_size
    results = data.run_packed(ranks, bodies.reduce_scatter_on_rank, salt, op, dtype, chunk, impl=impl)
    total = data.expected_reduction(op, _inputs(salt, op, dtype, chunk * world, world))
    for form, index in (("reduce_scatter_tensor", 0), ("reduce_scatter (list)", 1)):
        assert_ranks_equal([r[index] for r in results], list(total.split(chunk)), exact=data.reduction_is_exact(op),
                           what=f"{form}({op}) on {dtype} over {ranks.backend}")


def check_reduce_scatter_uneven(ranks, op, dtype, impl="torch"):
    salt, world = f"reduce_scatter_v/{op}/{dtype}", ranks.world_size
    sizes = bodies.uneven_sizes(world)
    results = data.run_packed(ranks, bodies.reduce_scatter_uneven_on_rank, salt, op, dtype, impl=impl)
    total = data.expected_reduction(op, _inputs(salt, op, dtype, sum(sizes), world))
    assert_ranks_equal(results, list(total.split(sizes)), exact=data.reduction_is_exact(op),
                       what=f"reduce_scatter (list, uneven sizes {sizes})({op}) on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("op, dtype", [_param(op, d, dtype=d) for op, d in data.reduce_cases()])
def test_all_reduce(ranks, op, dtype):
    check_all_reduce(ranks, op, dtype)


@pytest.mark.parametrize("op, dtype", [_param(op, d, dtype=d) for op, d in data.paired_reduce_cases()])
def test_reduce(ranks, op, dtype):
    check_reduce(ranks, op, dtype)


@pytest.mark.parametrize("op, dtype", [_param(op, d, dtype=d) for op, d in data.paired_reduce_cases()])
def test_reduce_scatter(ranks, op, dtype):
    check_reduce_scatter(ranks, op, dtype)


# The uneven form's reduction arithmetic is the even form's: one op per dtype family covers it.
@pytest.mark.parametrize("op, dtype", [_param("SUM", "float32", dtype="float32"), _param("MAX", "int64", dtype="int64"),
                                       _param("BXOR", "uint8", dtype="uint8"), _param("MIN", "bool", dtype="bool")])
def test_reduce_scatter_uneven(ranks, op, dtype):
    check_reduce_scatter_uneven(ranks, op, dtype)


@pytest.mark.parametrize("op, dtype", [_param(op, d, dtype=d) for op, d in data.undefined_cases()])
def test_all_reduce_rejects_undefined(ranks, op, dtype):
    """Bitwise ops on floating point and MIN/MAX/PRODUCT on complex have no meaning: every rank must
    get an error, never a value."""
    errors = data.run_packed(ranks, bodies.rejected_reduction_on_rank, op, dtype)
    silent = [rank for rank, err in enumerate(errors) if err is None]
    assert not silent, (f"all_reduce({op}) on {dtype} over {ranks.backend} returned a value on rank "
                        f"{silent} instead of raising ({op} is undefined on {dtype})")


def nonfinite_input(rank: int, world: int, dtype: str):
    """Columns: NaN on one rank; +inf everywhere; +inf on rank 0 and -inf elsewhere; -inf on the last
    rank and finite elsewhere; NaN on the last rank; NaN and inf on different ranks."""
    import torch

    nan, inf, last = float("nan"), float("inf"), rank == world - 1
    row = [nan if rank == 0 else 1.0, inf, inf if rank == 0 else -inf, -inf if last else 2.0,
           nan if last else -3.0, nan if rank == 0 else inf]
    return torch.tensor(row, dtype=getattr(torch, dtype), device="cpu")  # host-side; moved by the caller


def nonfinite_on_rank(ctx, op: str, dtype: str, impl: str = "torch"):
    dist = bodies.resolve_dist(impl)
    tensor = nonfinite_input(ctx.rank, ctx.world_size, dtype).to(ctx.device)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor


@pytest.mark.parametrize("op", ["MIN", "MAX", "SUM"])
@pytest.mark.parametrize("dtype", _dtype_params(data.FLOAT_DTYPES))
def test_all_reduce_nonfinite(ranks, op, dtype):
    """NaN propagates through MIN, MAX and SUM (as torch.min/max/sum do); inf - inf is NaN."""
    import torch

    world = ranks.world_size
    results = ranks.run(nonfinite_on_rank, op, dtype)
    stacked = torch.stack([nonfinite_input(r, world, dtype) for r in range(world)])
    expected = {"MIN": lambda: stacked.min(0).values, "MAX": lambda: stacked.max(0).values,
                "SUM": lambda: stacked.sum(0)}[op]()
    assert_ranks_equal(results, expected, exact=True,
                       what=f"all_reduce({op}) with NaN and inf on {dtype} over {ranks.backend}")


# -- data movement ----------------------------------------------------------------------------------

MOVE_NUMEL = 37


def check_broadcast(ranks, dtype, impl="torch"):
    salt, world = f"broadcast/{dtype}", ranks.world_size
    per_rank = data.run_packed(ranks, bodies.broadcast_on_rank, salt, dtype, MOVE_NUMEL, impl=impl)
    for src in range(world):
        want = data.payload(f"{salt}/{src}", src, MOVE_NUMEL, dtype)
        assert_bits([r[src] for r in per_rank], [want] * world, f"broadcast from src {src} on {dtype} over {ranks.backend}")


def check_all_gather(ranks, dtype, impl="torch"):
    import torch

    salt, world = f"all_gather/{dtype}", ranks.world_size
    results = data.run_packed(ranks, bodies.all_gather_on_rank, salt, dtype, MOVE_NUMEL, impl=impl)
    want = torch.cat([data.payload(salt, r, MOVE_NUMEL, dtype) for r in range(world)])
    assert_bits([r[0] for r in results], [want] * world, f"all_gather into one tensor on {dtype} over {ranks.backend}")
    assert_bits([r[1] for r in results], [want] * world, f"all_gather into a tensor list on {dtype} over {ranks.backend}")


def check_gather(ranks, dtype, impl="torch"):
    import torch

    salt, world = f"gather/{dtype}", ranks.world_size
    per_rank = data.run_packed(ranks, bodies.gather_on_rank, salt, dtype, MOVE_NUMEL, impl=impl)
    want = torch.cat([data.payload(salt, r, MOVE_NUMEL, dtype) for r in range(world)])
    for dst in range(world):
        listed = per_rank[dst][dst]
        assert_bits([torch.cat(listed)], [want], f"gather to dst {dst} on {dtype} over {ranks.backend} (rank 0 = dst)")


def check_scatter(ranks, dtype, impl="torch"):
    salt, world = f"scatter/{dtype}", ranks.world_size
    per_rank = data.run_packed(ranks, bodies.scatter_on_rank, salt, dtype, MOVE_NUMEL, impl=impl)
    for src in range(world):
        assert_bits([r[src] for r in per_rank],
                    [data.payload(f"{salt}/{src}", r, MOVE_NUMEL, dtype) for r in range(world)],
                    f"scatter from src {src} on {dtype} over {ranks.backend}")


def expected_all_to_all(salt, dtype, kind, world):
    import torch

    return [torch.cat([bodies.a2a_block(salt, src, dst, bodies.a2a_sizes(kind, src, dst, world), dtype)
                       for src in range(world)]) for dst in range(world)]


def check_all_to_all(ranks, dtype, kind, form="single", impl="torch"):
    salt, world = f"all_to_all/{form}/{kind}/{dtype}", ranks.world_size
    body = bodies.all_to_all_single_on_rank if form == "single" else bodies.all_to_all_list_on_rank
    results = data.run_packed(ranks, body, salt, dtype, kind, impl=impl)
    assert_bits(results, expected_all_to_all(salt, dtype, kind, world),
                f"all_to_all{'_single' if form == 'single' else ' (list)'} with {kind} splits on {dtype} over "
                f"{ranks.backend}")


@pytest.mark.parametrize("dtype", _dtype_params(data.MOVEMENT_DTYPES))
def test_broadcast(ranks, dtype):
    check_broadcast(ranks, dtype)


@pytest.mark.parametrize("dtype", _dtype_params(data.MOVEMENT_DTYPES))
def test_all_gather(ranks, dtype):
    check_all_gather(ranks, dtype)


@pytest.mark.parametrize("dtype", _dtype_params(data.MOVEMENT_DTYPES))
def test_gather(ranks, dtype):
    check_gather(ranks, dtype)


@pytest.mark.parametrize("dtype", _dtype_params(data.MOVEMENT_DTYPES))
def test_scatter(ranks, dtype):
    check_scatter(ranks, dtype)


@pytest.mark.parametrize("dtype", _dtype_params(data.MOVEMENT_DTYPES))
def test_all_to_all_single(ranks, dtype):
    check_all_to_all(ranks, dtype, "uneven")


# Split handling does not depend on the dtype: the other split kinds and the list form on one each.
@pytest.mark.parametrize("form, kind, dtype", [
    _param("single", "even", "float64", dtype="float64"), _param("single", "zero", "int32", dtype="int32"),
    _param("list", "even", "bfloat16", dtype="bfloat16"), _param("list", "uneven", "float32", dtype="float32"),
    _param("list", "zero", "uint8", dtype="uint8")])
def test_all_to_all_splits(ranks, form, kind, dtype):
    check_all_to_all(ranks, dtype, kind, form)


# -- coalesced, async, objects, barrier ---------------------------------------------------------------

def check_coalesced(ranks, dtype, impl="torch"):
    import torch

    salt, world, sizes = f"coalesced/{dtype}", ranks.world_size, (3, 5)
    results = data.run_packed(ranks, bodies.coalesced_on_rank, salt, dtype, impl=impl)
    reduced = [data.expected_reduction("SUM", _inputs(f"{salt}/{i}", "SUM", dtype, n, world))
               for i, n in enumerate(sizes)]
    gathered = [torch.cat([data.payload(f"{salt}/{i}", r, n, dtype) for r in range(world)]) for i, n in enumerate(sizes)]
    totals = [data.expected_reduction("SUM", _inputs(f"{salt}/rs{i}", "SUM", dtype, n * world, world))
              for i, n in enumerate(sizes)]
    for form in results[0]:
        for i, n in enumerate(sizes):
            if "reduce_scatter" in form:
                wanted = list(totals[i].split(n))
            else:
                wanted = gathered[i] if "gather" in form else reduced[i]
            assert_bits([r[form][i] for r in results], wanted if isinstance(wanted, list) else [wanted] * world,
                        f"{form}, tensor {i} of {len(sizes)}, on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("dtype", _dtype_params(["float32", "int64", "bfloat16"]))
def test_coalesced(ranks, dtype):
    check_coalesced(ranks, dtype)


def expected_async(name: str, salt: str, world: int) -> list[list]:
    """What each rank's filled tensors must hold after wait() (see ``bodies._async_call``)."""
    import torch

    inputs = [data.reduce_input(salt, r, 4, "float32", "SUM") for r in range(world)]
    fulls = [data.reduce_input(salt, r, 4 * world, "float32", "SUM") for r in range(world)]
    last = world - 1
    if name == "all_reduce":
        return [[sum(inputs)]] * world
    if name == "broadcast":
        return [[inputs[last]]] * world
    if name == "reduce":
        return [[] for _ in range(last)] + [[sum(inputs)]]
    if name == "all_gather":
        return [list(inputs)] * world
    if name == "all_gather_into_tensor":
        return [[torch.cat(inputs)]] * world
    if name == "gather":
        return [[] for _ in range(last)] + [list(inputs)]
    if name == "scatter":
        return [[inputs[r]] for r in range(world)]
    if name.startswith("reduce_scatter"):
        return [[sum(fulls)[4 * r:4 * (r + 1)]] for r in range(world)]
    if name.startswith("all_to_all"):
        return [[torch.cat([f[4 * r:4 * (r + 1)] for f in fulls])] for r in range(world)]
    return [[] for _ in range(world)]


def _flat_tensors(value) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return [value.reshape(-1)] if hasattr(value, "reshape") else []


def async_completion_problem(rank: int, record: dict, wait_blocks_host: bool) -> str | None:
    """Whether the work says it is complete when it must: right after wait() where wait() blocks the host
    (gloo), else once the device has synchronized (NCCL's wait() only orders the current stream after
    its own, so is_completed() right after it races the device: ``semantics.wait_blocks_host``)."""
    if record["completed"] is True:
        return None
    if wait_blocks_host:
        return f"rank {rank}: is_completed() is {record['completed']!r} after wait()"
    if record.get("completed_after_sync") is not True:
        return (f"rank {rank}: is_completed() is {record.get('completed_after_sync')!r} even after the device "
                "synchronized (wait() is stream-ordered here: semantics.wait_blocks_host is false)")
    return None


def check_async(ranks, name, impl="torch"):
    import torch

    salt, world = f"async/{name}", ranks.world_size
    records = data.run_packed(ranks, bodies.async_on_rank, salt, name, impl=impl)
    what = f"{name}(async_op=True) over {ranks.backend}"
    problems = []
    for rank, (record, wanted) in enumerate(zip(records, expected_async(name, salt, world))):
        if record["work"] is None:
            problems.append(f"rank {rank}: returned no work handle")
            continue
        for i, (got, want) in enumerate(zip(record["after_wait"], wanted)):
            if (problem := data.same_bits(got, want)) is not None:
                problems.append(f"rank {rank}: right after wait() returned, output {i} is not in place: {problem}")
        if (problem := async_completion_problem(rank, record, ranks.descriptor.semantics.wait_blocks_host)):
            problems.append(problem)
        if "future_error" in record:
            problems.append(f"rank {rank}: get_future() failed: {record['future_error']}")
        elif wanted and name not in ("reduce", "gather"):  # their futures' values are not specified per rank
            value = _flat_tensors(record["future"])
            if not value or data.same_bits(torch.cat(value), torch.cat([t.reshape(-1) for t in wanted])):
                problems.append(f"rank {rank}: get_future().wait() gives {record['future']!r}, not the output")
    raise_problems(problems, what)


@pytest.mark.parametrize("name", bodies.ASYNC_COLLECTIVES)
def test_async(ranks, name):
    check_async(ranks, name)


def check_object_collectives(ranks, impl="torch"):
    salt, world = "objects", ranks.world_size
    results = data.run_packed(ranks, bodies.object_collectives_on_rank, salt, impl=impl)
    problems = []
    everyone = [bodies.rank_object(salt, r) for r in range(world)]

    def expect(rank, form, got, want):
        if got != want:
            problems.append(f"rank {rank}: {form}: got {got!r}, expected {want!r}")

    for rank, record in enumerate(results):
        expect(rank, "all_gather_object", record["all_gather_object"], everyone)
        for root in range(world):
            if rank == root:
                expect(rank, f"gather_object to dst {root}", record["gather_object"][root],
                       [bodies.rank_object(f"{salt}/g{root}", r) for r in range(world)])
            expect(rank, f"broadcast_object_list from src {root}", record["broadcast_object_list"][root],
                   [bodies.rank_object(f"{salt}/b{root}/{i}", root) for i in range(3)])
            expect(rank, f"scatter_object_list from src {root}", record["scatter_object_list"][root],
                   bodies.rank_object(f"{salt}/s{root}", rank))
    raise_problems(problems, f"object collectives over {ranks.backend}")


def test_object_collectives(ranks):
    check_object_collectives(ranks)


def barrier_on_rank(ctx, round_id: int):
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    marker_dir = Path(ctx.shared_dir) / f"barrier-{round_id}"
    marker_dir.mkdir(exist_ok=True)
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.2)  # the last rank arrives late: nobody may pass the barrier before it does
    (marker_dir / f"rank{ctx.rank}").write_text(str(os.getpid()))
    dist.barrier()
    return sorted(p.name for p in marker_dir.iterdir())


@shared_dir  # the ranks leave marker files for each other
def test_barrier(ranks):
    import uuid

    seen = ranks.run(barrier_on_rank, uuid.uuid4().int % 10**9)
    everyone = sorted(f"rank{r}" for r in range(ranks.world_size))
    for rank, names in enumerate(seen):
        assert names == everyone, (f"rank {rank} passed the barrier over {ranks.backend} before every rank "
                                   f"arrived: saw {names}, expected {everyone}")
