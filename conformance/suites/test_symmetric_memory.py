"""Symmetric memory: allocation, rendezvous, one-sided put_signal / wait_signal, and the API surface.

Two halves:

* On a backend with symmetric memory (capability ``symmetric_memory``; ``put_signal`` also needs
  NCCL >= 2.29 in torch 2.13): allocation through ``empty`` + ``rendezvous``; put_signal/wait_signal
  pairwise odd -> even (as upstream's own test) and even -> odd; a ring that signals every peer;
  100 rounds through one signal; several sizes and dtypes; a wait posted before its put; and the
  error cases (a peer outside the group, rendezvous of a tensor symmetric memory did not allocate);
  and the collectives on real symmetric buffers, each compared with what the ranks' inputs give:
  one-shot and two-shot all_reduce, multimem all_reduce (skipped, saying why, without multicast),
  low-contention all_gather and reduce_scatter, fused_all_gather_matmul, get_remote_tensors, and a
  rendezvous on a sub-group (at 2 ranks a group of one, at 4 a pair).
  The bodies live in ``_symmetric_memory_bodies`` behind ``conformance.symmetric_memory``, so the
  project's own tests run the very same bodies on a CPU reference implementation and on broken ones.
* Everywhere: the API surface. The functions exist with their documented signatures,
  ``get_backend``/``set_backend`` behave as documented, put/wait on a device without a put/wait
  backend raise the documented ``ValueError``, the meta kernels of the symm_mem ops give the right
  shapes, and the capability probe records torch's own reason when symmetric memory is missing.
"""

from __future__ import annotations

import inspect

import pytest

from conformance import min_ranks, requires
from conformance.suites import _symmetric_memory_bodies as bodies

IMPL = "torch"
SIZES_AND_DTYPES = [(1, "float32"), (4099, "float32"), (1 << 20, "float32"), (1000, "bfloat16"),
                    (1000, "float16"), (777, "int32"), (256, "uint8"), (65, "float64")]



def _case(numel, dtype_name):
    marks = [requires("bf16")] if dtype_name == "bfloat16" else []
    return pytest.param(numel, dtype_name, marks=marks, id=f"{numel}-{dtype_name}")


# -- functions that run on every rank -------------------------------------------------------------

def allocate_on_rank(ctx):
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    from conformance.symmetric_memory import resolve

    mem = resolve(IMPL)(ctx)
    tensor = mem.allocate((4, 8), torch.float32)
    tensor.fill_(ctx.rank)
    hdl = mem.rendezvous(tensor)
    mem.barrier()
    return {"is_symmetric": symm_mem.is_symm_mem_tensor(tensor),
            "plain_is_symmetric": symm_mem.is_symm_mem_tensor(torch.zeros(4, device=ctx.device)),
            "handle_rank": getattr(hdl, "rank", None), "handle_world_size": getattr(hdl, "world_size", None),
            "backend": symm_mem.get_backend(ctx.device), "local": tensor.clone(), "shape": tuple(tensor.shape)}


def empty_error_on_rank(ctx):
    import torch.distributed._symmetric_memory as symm_mem

    try:
        symm_mem.empty(16, device=ctx.device)
    except Exception as exc:
        return str(exc).strip().splitlines()[0]
    return None


def backend_selection_on_rank(ctx):
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    before = symm_mem.get_backend(ctx.device)
    try:
        symm_mem.set_backend("NO_SUCH_BACKEND")
        error = None
    except Exception as exc:
        error = (type(exc).__name__, str(exc).strip().splitlines()[0])
    return {"cpu": symm_mem.get_backend("cpu"), "cpu_device": symm_mem.get_backend(torch.device("cpu")),
            "before": before, "after": symm_mem.get_backend(ctx.device), "set_error": error}


class _HandleOnCpu:
    """Stands in for a handle: wait_signal reads only ``hdl.device`` before it dispatches."""

    device = None

    def __init__(self):
        import torch

        self.device = torch.device("cpu")


def unsupported_put_wait_on_rank(ctx):
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    outcome = {}
    for name, call in (("put_signal", lambda: symm_mem.put_signal(torch.zeros(4, device="cpu"), _HandleOnCpu(), 0)),
                       ("wait_signal", lambda: symm_mem.wait_signal(_HandleOnCpu(), 0))):
        try:
            call()
            outcome[name] = None
        except Exception as exc:
            outcome[name] = (type(exc).__name__, str(exc))
    return outcome


def meta_shapes_on_rank(ctx):
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401  (registers the Python meta kernels)

    group = ctx.group.group_name
    rows = 4 * ctx.world_size
    m = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    ops = torch.ops.symm_mem

    def described(value):
        if isinstance(value, (list, tuple)):
            return [described(v) for v in value]
        return None if value is None else (tuple(value.shape), str(value.dtype), value.device.type)

    cases = {
        "one_shot_all_reduce": lambda: ops.one_shot_all_reduce(m(rows, 8), "sum", group),
        "_low_contention_all_gather": lambda: ops._low_contention_all_gather(m(rows, 8), group),
        "_low_contention_reduce_scatter": lambda: ops._low_contention_reduce_scatter(m(rows, 8), "sum", group),
        "fused_all_gather_matmul": lambda: ops.fused_all_gather_matmul(m(rows, 8), [m(8, 3), m(8, 5)], 0, group),
        "fused_all_gather_matmul(return_A=False)":
            lambda: ops.fused_all_gather_matmul(m(rows, 8), [m(8, 3)], 0, group, return_A=False),
        "fused_matmul_reduce_scatter": lambda: ops.fused_matmul_reduce_scatter(m(rows, 8), m(8, 6), "sum", 0, group),
        "get_remote_tensors": lambda: ops.get_remote_tensors(m(rows, 8), group),
    }
    out = {}
    for name, call in cases.items():
        try:
            out[name] = described(call())
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _shapes(value):
    if isinstance(value, (list, tuple)):
        return [_shapes(v) for v in value]
    return None if value is None else tuple(value.shape)


def torch_impl_on_meta_rank(ctx):
    """The "torch" implementation's collectives on meta tensors: each must reach its torch.ops.symm_mem op
    with the rank's group name (the ops without a meta kernel raise, naming the op they were called as);
    and what ``unsupported`` says of each op on this rank's device."""
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401  (registers the Python meta kernels)

    from conformance.symmetric_memory import OPERATIONS, TorchSymmetricMemory

    mem = TorchSymmetricMemory(ctx)
    m = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    rows = 4 * ctx.world_size
    cases = {
        "one_shot_all_reduce": lambda: mem.one_shot_all_reduce(m(rows, 8)),
        "two_shot_all_reduce_": lambda: mem.two_shot_all_reduce_(m(rows, 8)),
        "multimem_all_reduce_": lambda: mem.multimem_all_reduce_(m(rows, 8)),
        "_low_contention_all_gather": lambda: mem.low_contention_all_gather(m(rows, 8)),
        "_low_contention_reduce_scatter": lambda: mem.low_contention_reduce_scatter(m(rows, 8)),
        "fused_all_gather_matmul": lambda: mem.fused_all_gather_matmul(m(rows, 8), [m(8, 3)], 0, return_A=False),
        "get_remote_tensors": lambda: mem.get_remote_tensors(m(rows, 8)),
    }
    out = {}
    for name, call in cases.items():
        try:
            out[name] = _shapes(call())
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return {"meta": out, "unsupported": {op: mem.unsupported(op) for op in OPERATIONS}}


# -- the API surface: runs on every backend -------------------------------------------------------

DOCUMENTED_SIGNATURES = {
    "empty": ["size", "dtype", "device"],
    "rendezvous": ["tensor", "group"],
    "put_signal": ["src", "hdl", "peer"],
    "wait_signal": ["hdl", "peer"],
    "set_backend": ["name"],
    "get_backend": ["device"],
    "is_nvshmem_available": [],
    "is_symm_mem_tensor": ["tensor"],
}


@pytest.mark.parametrize("function", sorted(DOCUMENTED_SIGNATURES))
def test_function_has_documented_signature(function):
    import torch.distributed._symmetric_memory as symm_mem

    fn = getattr(symm_mem, function, None)
    assert callable(fn), f"torch.distributed._symmetric_memory.{function} is missing"
    params = list(inspect.signature(fn).parameters)
    assert params == DOCUMENTED_SIGNATURES[function], (
        f"torch.distributed._symmetric_memory.{function}{inspect.signature(fn)}: parameters {params}, "
        f"documented {DOCUMENTED_SIGNATURES[function]}")


def test_get_and_set_backend_behave_as_documented(ranks):
    results = ranks.run(backend_selection_on_rank)
    for rank, res in enumerate(results):
        # "If not found, return None": no symmetric memory backend is ever registered for CPU.
        assert res["cpu"] is None and res["cpu_device"] is None, (
            f"rank {rank}: get_backend('cpu') returned {res['cpu']!r} / {res['cpu_device']!r}, documented None")
        assert res["before"] is None or res["before"] in ("NVSHMEM", "CUDA", "NCCL"), (
            f"rank {rank}: get_backend({ranks.device}) returned {res['before']!r}: neither None nor a documented backend")
        assert res["set_error"] is not None, (
            f"rank {rank}: set_backend('NO_SUCH_BACKEND') was accepted; only NVSHMEM, CUDA and NCCL are documented")
        assert res["set_error"][0] == "RuntimeError", f"rank {rank}: set_backend('NO_SUCH_BACKEND') raised {res['set_error']}"
        assert res["after"] == res["before"], (
            f"rank {rank}: a refused set_backend changed get_backend from {res['before']!r} to {res['after']!r}")


def test_put_and_wait_on_unsupported_backend_raise_value_error(ranks):
    """put/wait dispatch on get_backend(device); CPU has none, so both raise the documented ValueError."""
    for rank, outcome in enumerate(ranks.run(unsupported_put_wait_on_rank)):
        for name, error in outcome.items():
            assert error is not None, f"rank {rank}: {name} on a CPU tensor returned instead of raising"
            assert error == ("ValueError", f"{name}: unsupported backend: None"), (
                f"rank {rank}: {name} on a CPU tensor raised {error[0]}: {error[1]!r}, documented "
                f"ValueError('{name}: unsupported backend: None')")


def test_meta_kernels_give_the_right_shapes(ranks):
    world, rows = ranks.world_size, 4 * ranks.world_size
    f32 = "torch.float32"
    expected = {
        "one_shot_all_reduce": ((rows, 8), f32, "meta"),
        "_low_contention_all_gather": ((rows * world, 8), f32, "meta"),
        "_low_contention_reduce_scatter": ((rows // world, 8), f32, "meta"),
        "fused_all_gather_matmul": [((rows * world, 8), f32, "meta"),
                                    [((rows * world, 3), f32, "meta"), ((rows * world, 5), f32, "meta")]],
        "fused_all_gather_matmul(return_A=False)": [None, [((rows * world, 3), f32, "meta")]],
        "fused_matmul_reduce_scatter": ((rows // world, 6), f32, "meta"),
        "get_remote_tensors": [((rows, 8), f32, "meta")] * world,
    }
    for rank, shapes in enumerate(ranks.run(meta_shapes_on_rank)):
        wrong = {op: (shapes[op], want) for op, want in expected.items() if shapes[op] != want}
        assert not wrong, "\n".join(f"rank {rank}: symm_mem.{op} on meta tensors gave {got}, expected {want}"
                                    for op, (got, want) in wrong.items())


def test_torch_implementation_reaches_the_ops(ranks):
    """``conformance.symmetric_memory.TorchSymmetricMemory``, which the suite's collectives on real buffers
    go through, calls each torch.ops.symm_mem op with the group's name: on meta tensors the ops with a meta
    kernel give the right shapes, the two without raise naming the op. Its ``unsupported`` names the op
    when this device has no kernel for it (on CPU: none of them)."""
    world, rows = ranks.world_size, 4 * ranks.world_size
    expected = {
        "one_shot_all_reduce": (rows, 8),
        "_low_contention_all_gather": (rows * world, 8),
        "_low_contention_reduce_scatter": (rows // world, 8),
        "fused_all_gather_matmul": [None, [(rows * world, 3)]],
        "get_remote_tensors": [(rows, 8)] * world,
    }
    problems = []
    for rank, res in enumerate(ranks.run(torch_impl_on_meta_rank)):
        got = res["meta"]
        problems += [f"rank {rank}: TorchSymmetricMemory's {op} on meta tensors gave {got[op]}, expected {want}"
                     for op, want in expected.items() if got[op] != want]
        problems += [f"rank {rank}: TorchSymmetricMemory's {op} on meta tensors gave {got[op]!r}, expected an error "
                     f"naming symm_mem::{op} (it has no meta kernel)"
                     for op in ("two_shot_all_reduce_", "multimem_all_reduce_")
                     if not (isinstance(got[op], str) and f"symm_mem::{op}" in got[op])]
        for op, why in res["unsupported"].items():
            if why is not None and f"symm_mem::{op}" not in why:
                problems.append(f"rank {rank}: unsupported({op!r}) on {ranks.device} says {why!r}, not naming the op")
            if why is None and ranks.device == "cpu":
                problems.append(f"rank {rank}: unsupported({op!r}) on cpu is None, but torch has no CPU kernel for it")
    assert not problems, f"symm_mem ops through the torch implementation over {ranks.backend}:\n" + "\n".join(problems)


def test_probe_records_torchs_reason(ranks):
    """Unavailable: the probe's reason is torch's own error from ``empty`` on this device, verbatim.
    Available: ``empty`` works on every rank."""
    probe = ranks.capabilities.probes["symmetric_memory"]
    errors = ranks.run(empty_error_on_rank)
    if probe.available:
        assert errors == [None] * ranks.world_size, f"the probe found symmetric memory but empty failed: {errors}"
        return
    for rank, error in enumerate(errors):
        assert error == probe.reason, (f"rank {rank}: empty() on {ranks.device} raised {error!r}; the probe "
                                       f"recorded {probe.reason!r}")
    if ranks.device == "cpu":
        assert probe.reason == "SymmetricMemory does not support device type cpu"


# -- symmetric memory itself: needs the capability ------------------------------------------------

@requires("symmetric_memory")
def test_allocate_and_rendezvous(ranks):
    import torch

    for rank, res in enumerate(ranks.run(allocate_on_rank)):
        assert res["is_symmetric"], f"rank {rank}: is_symm_mem_tensor is False for a tensor from empty()"
        assert not res["plain_is_symmetric"], f"rank {rank}: is_symm_mem_tensor is True for torch.zeros"
        assert res["shape"] == (4, 8), f"rank {rank}: empty(4, 8) gave shape {res['shape']}"
        assert (res["handle_rank"], res["handle_world_size"]) == (rank, ranks.world_size), (
            f"rank {rank}: the rendezvous handle says rank {res['handle_rank']} of {res['handle_world_size']}")
        assert res["backend"] in ("NVSHMEM", "CUDA", "NCCL"), f"rank {rank}: get_backend after empty: {res['backend']!r}"
        assert torch.equal(res["local"], torch.full((4, 8), float(rank))), f"rank {rank}: the buffer lost its contents"


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
@pytest.mark.parametrize("direction", ["odd->even", "even->odd"])
def test_put_signal_pairwise(ranks, direction):
    bodies.check_pairwise(ranks, IMPL, direction)


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
def test_put_signal_ring_to_every_peer(ranks):
    bodies.check_ring(ranks, IMPL)


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
def test_put_signal_100_rounds_one_signal(ranks):
    bodies.check_rounds(ranks, IMPL, rounds=100)


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
@pytest.mark.parametrize("numel, dtype_name", [_case(n, d) for n, d in SIZES_AND_DTYPES])
def test_put_signal_sizes_and_dtypes(ranks, numel, dtype_name):
    bodies.check_pairwise(ranks, IMPL, "odd->even", numel, dtype_name)


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
def test_wait_posted_before_put(ranks):
    bodies.check_wait_before_put(ranks, IMPL)


@requires("symmetric_memory", "put_signal")
@min_ranks(2)  # a put needs a peer
def test_error_cases(ranks):
    bodies.check_errors(ranks, IMPL)


@requires("symmetric_memory")
@min_ranks(2)  # a collective over one rank would not show a peer's data
@pytest.mark.parametrize("op", bodies.SYMM_OPS)
def test_symm_op_on_real_buffers(ranks, op):
    bodies.check_symm_op(ranks, IMPL, op)


@requires("symmetric_memory")
@min_ranks(2)  # a collective over one rank would not show a peer's data
def test_fused_all_gather_matmul_on_real_buffers(ranks):
    bodies.check_fused_all_gather_matmul(ranks, IMPL)


@requires("symmetric_memory")
@min_ranks(2)  # a sub-group smaller than the world
def test_rendezvous_on_a_sub_group(ranks):
    bodies.check_subgroup_rendezvous(ranks, IMPL)
