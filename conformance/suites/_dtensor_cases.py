"""DTensor beyond argmax/argmin: the cases, the rank functions that evaluate them, and their verdicts.

Three groups, each evaluated by one ``ranks.run`` per mesh through ``_dtensor_mesh.run_cases`` (the
ranks agree on every case's outcome before the next):

* ``redistribute``: every source placement (Replicate, Shard(0), Shard(1), Partial sum/avg/max/min
  built from real per-rank partial values) to every target (Replicate, Shard(0), Shard(1), and
  Replicate to each Partial), on an even, an uneven and a one-row tensor (more ranks than rows:
  empty shards); a lean set of pairs on a 2 x 2 mesh. The full tensor must come back exactly
  (integer values), the local shard must be the one torch.chunk gives, the placements the target.
* ``ops``: sharding propagation, forward and backward: matmul and bmm (results that must be
  Partial or Shard), vocab-parallel embedding, softmax, layer_norm, sum and mean over a sharded dim,
  min/max(dim) values and indices; against eager on the full tensors.
* ``random``: dropout on a Replicate input gives the same mask on every rank; on a Shard(0) input
  the shards get different masks (not one mask repeated).

``verdict`` (controller side) turns a record into None (conformant) or the explanation.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from conformance.suites._dtensor_mesh import disagreement, resolve_injected, run_cases

SHAPES = {"even": (4, 6), "uneven": (5, 7), "one_row": (1, 6)}
SOURCES_1D = ("R", "S0", "S1", "P(sum)", "P(avg)", "P(max)", "P(min)")
TARGETS_1D = ("R", "S0", "S1")
# 2 x 2 mesh: a lean set that still moves data along each mesh dim, both at once, and out of Partial.
PAIRS_2D = [("R,R", "S0,S1"), ("S0,S1", "R,R"), ("S0,S1", "S1,S0"), ("S0,S0", "R,S1"), ("S1,R", "S0,S0"),
            ("P(sum),S0", "R,R"), ("S0,P(max)", "S0,R"), ("P(avg),P(avg)", "R,R"), ("P(min),P(min)", "S1,R"),
            ("S1,P(sum)", "S0,S1")]


@dataclass(frozen=True)
class Redistribution:
    source: str
    target: str
    shape: str

    @property
    def id(self) -> str:
        return f"{self.source}->{self.target}-{self.shape}"


def redistributions(mesh: str) -> list[Redistribution]:
    if mesh == "2d":
        return [Redistribution(s, t, shape) for s, t in PAIRS_2D for shape in ("even", "uneven")]
    pairs = [(s, t) for s in SOURCES_1D for t in TARGETS_1D]  # to Partial is internal-only in DTensor's API
    return [Redistribution(s, t, shape) for s, t in pairs for shape in SHAPES]


def _generator(*key):
    import torch

    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, key)).encode()))


def global_tensor(shape_name: str, salt: str):
    import torch

    return torch.randint(-20, 21, SHAPES[shape_name], generator=_generator(salt, shape_name), device="cpu").float()


def partial_values(target, op: str, count: int, salt: str) -> list:
    """``count`` integer-valued tensors whose reduction by ``op`` is exactly ``target``: every rank holds
    a real share (for max/min a random rank holds each element's extreme), not rank 0 the whole value."""
    import torch

    gen = _generator(salt, op, count)
    if op in ("sum", "avg"):
        noise = [torch.randint(-9, 10, target.shape, generator=gen, device="cpu").float().to(target.device)
                 for _ in range(count - 1)]
        if op == "sum":
            return noise + [target - sum(noise, torch.zeros_like(target))]
        return [target + n for n in noise] + [target - sum(noise, torch.zeros_like(target))]
    winner = torch.randint(0, count, target.shape, generator=gen, device="cpu").to(target.device)
    gap = torch.randint(1, 9, (count, *target.shape), generator=gen, device="cpu").float().to(target.device)
    sign = -1.0 if op == "max" else 1.0
    return [torch.where(winner == k, target, target + sign * gap[k]) for k in range(count)]


def _placement(name: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if name == "R":
        return Replicate()
    if name.startswith("S"):
        return Shard(int(name[1:]))
    return Partial(name[2:-1])


def placements(spec: str) -> list:
    return [_placement(p) for p in spec.split(",")]


def local_part(full, spec: str, coords: tuple[int, ...], sizes: tuple[int, ...], salt: str):
    """This rank's local tensor for ``spec`` (its partial value, then its shard of each sharded dim)."""
    import torch

    local = full
    names = spec.split(",")
    for mesh_dim, name in enumerate(names):
        if name.startswith("P"):
            parts = partial_values(full, name[2:-1], sizes[mesh_dim], f"{salt}/{mesh_dim}")
            local = parts[coords[mesh_dim]]
    for mesh_dim, name in enumerate(names):
        if name.startswith("S"):
            chunks = torch.chunk(local, sizes[mesh_dim], dim=int(name[1:]))
            local = chunks[coords[mesh_dim]] if coords[mesh_dim] < len(chunks) else \
                local.narrow(int(name[1:]), 0, 0)
    return local


def _coords(mesh) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(mesh.get_coordinate()), tuple(mesh.shape)


def default_redistribute(dtensor, mesh, target: list):
    return dtensor.redistribute(mesh, target)


def _redistribute_case(ctx, case: Redistribution, mesh, redistribute) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    salt = f"redistribute/{case.id}"
    full = global_tensor(case.shape, salt).to(ctx.device)
    coords, sizes = _coords(mesh)
    local = local_part(full, case.source, coords, sizes, salt).contiguous()
    source = DTensor.from_local(local, mesh, placements(case.source), run_check=False, shape=full.shape,
                                stride=full.stride())
    result = redistribute(source, mesh, placements(case.target))
    record: dict[str, Any] = {"placements": [str(p) for p in result.placements],
                              "wanted": [str(p) for p in placements(case.target)],
                              "full": result.full_tensor(), "expected": full}
    if "P" not in case.target:  # a Partial result's local values are the implementation's choice
        want = local_part(full, case.target, coords, sizes, salt)
        record["local_problem"] = None if torch.equal(result.to_local(), want) else (
            f"local tensor {result.to_local().tolist()}, expected {want.tolist()} (torch.chunk of the full tensor)")
    return record


def evaluate_redistribute(ctx, mesh: str, redistributor: str = "dtensor") -> dict[str, dict]:
    """Rank function: every redistribution of ``mesh`` through ``redistributor`` (``"dtensor"``:
    ``DTensor.redistribute``; or ``"package.module:ATTRIBUTE"``, a ``(dtensor, mesh, placements) ->
    DTensor`` function)."""
    shape = (ctx.world_size,) if mesh == "1d" else (2, 2)
    redistribute = resolve_injected(redistributor, default_redistribute, "redistributor")
    return run_cases(ctx, shape, [(c.id, lambda m, c=c: _redistribute_case(ctx, c, m, redistribute))
                                  for c in redistributions(mesh)])


def redistribute_verdict(case: Redistribution, record: dict) -> str | None:
    what = f"redistribute {case.source} -> {case.target} of a {SHAPES[case.shape]} tensor"
    if (split := disagreement(record)) is not None:
        return f"{what}: the ranks disagree ({split})"
    if "error" in record:
        return f"{what} raised {record['error']} (at {', '.join(record.get('where', []))})"
    if record["placements"] != record["wanted"]:
        return f"{what} gave placements {record['placements']}, expected {record['wanted']}"
    if not _equal(record["full"], record["expected"]):
        return f"{what}: full tensor {record['full'].tolist()}, expected {record['expected'].tolist()}"
    if record.get("local_problem"):
        return f"{what}: {record['local_problem']}"
    return None


def _equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


# -- sharding propagation: forward and backward ---------------------------------------------------

# (op, input placements per operand, expected output placement or None when any is acceptable)
OPS_1D = [
    ("matmul", ("S1", "S0"), "P(sum)"), ("matmul", ("S0", "R"), "S0"), ("matmul", ("R", "S1"), "S1"),
    ("bmm", ("S0", "S0"), "S0"), ("bmm", ("S2", "S1"), "P(sum)"),
    ("embedding", ("R", "S0"), None), ("embedding", ("S0", "R"), "S0"), ("embedding_reduced_twice", ("R", "S0"), None),
    ("softmax", ("S0",), "S0"), ("softmax", ("S1",), None),
    ("layer_norm", ("S0",), "S0"),
    ("sum", ("S1",), "P(sum)"), ("sum", ("S0",), "S0"), ("mean", ("S1",), None),
    ("max", ("S0",), None), ("min", ("S1",), None), ("max", ("S1",), None),
    ("softmax", ("S0-one_row",), None), ("sum", ("S0-one_row",), None),
]
OPS_2D = [("matmul", ("S0,S1", "R,S0"), None), ("softmax", ("S0,S1",), None), ("sum", ("S1,S0",), None),
          ("layer_norm", ("S0,R",), None), ("embedding", ("R,R", "R,S0"), None)]


def op_case_id(op: str, specs: tuple[str, ...]) -> str:
    return f"{op}-{'-'.join(s.replace(',', '.') for s in specs)}".replace(".", ",")


def _op_inputs(op: str, one_row: bool, device):
    """The full operands (eager and DTensor see the same), and which ones take gradients."""
    import torch

    gen = _generator("ops", op, one_row)
    rows = 1 if one_row else 4

    def rnd(*shape):
        return torch.randint(-4, 5, shape, generator=gen, device="cpu").float().to(device)

    if op == "matmul":
        return [rnd(rows, 6), rnd(6, 4)], [True, True]
    if op == "bmm":
        return [rnd(2, rows, 6), rnd(2, 6, 4)], [True, True]
    if op.startswith("embedding"):
        ids = torch.randint(0, 8, (rows, 3), generator=gen, device="cpu").to(device)
        return [ids, rnd(8, 5)], [False, True]
    return [torch.randn(rows, 6, generator=gen, device="cpu").to(device)], [True]


def _apply_op(op: str, args):
    import torch
    import torch.nn.functional as F

    if op == "matmul":
        return args[0] @ args[1]
    if op == "bmm":
        return torch.bmm(args[0], args[1])
    if op.startswith("embedding"):
        return F.embedding(args[0], args[1])
    if op == "softmax":
        return torch.softmax(args[0], dim=-1)
    if op == "layer_norm":
        return F.layer_norm(args[0], (args[0].shape[-1],))
    if op == "sum":
        return args[0].sum(dim=1)
    if op == "mean":
        return args[0].mean(dim=1)
    values, indices = getattr(torch, op)(args[0], dim=1)
    return values, indices


def default_apply_op(op: str, args):
    """What the suite checks: the op itself, applied to DTensor operands (``_apply_op``)."""
    return _apply_op(op, args)


def _op_case(ctx, op: str, specs: tuple[str, ...], mesh, apply_op=default_apply_op) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import distribute_tensor

    one_row = any(s.endswith("-one_row") for s in specs)
    specs = tuple(s.removesuffix("-one_row") for s in specs)
    fulls, grads = _op_inputs(op, one_row, ctx.device)
    eager_in = [f.clone().requires_grad_(g) for f, g in zip(fulls, grads)]
    eager = _apply_op(op, eager_in)
    dist_in = [distribute_tensor(f.clone(), mesh, placements(s)).requires_grad_(g)
               for f, s, g in zip(fulls, specs, grads)]
    result = apply_op(op, dist_in)
    record: dict[str, Any] = {}
    outs, refs = (result, eager) if isinstance(result, tuple) else ((result,), (eager,))
    record["placements"] = [str(p) for p in outs[0].placements]
    if op == "embedding_reduced_twice":  # a DTensor may be reduced more than once (full_tensor is not a move)
        outs[0].full_tensor()
    fulls = [o.full_tensor() for o in outs]  # min/max(dim): values and indices; the gradient flows from values
    record["full"], record["eager"] = [f.detach() for f in fulls], [r.detach() for r in refs]
    upstream = torch.randn(refs[0].shape, generator=_generator("upstream", op), device="cpu").to(ctx.device)
    (refs[0] * upstream).sum().backward()
    (fulls[0] * upstream).sum().backward()
    record["grads"] = [(d.grad.full_tensor(), e.grad) for d, e in zip(dist_in, eager_in) if e.grad is not None]
    return record


def evaluate_ops(ctx, mesh: str, applier: str = "dtensor") -> dict[str, dict]:
    """Rank function: every op case of ``mesh``, the DTensor side applied by ``applier`` (``"dtensor"``:
    the op itself; else ``"package.module:ATTRIBUTE"``, ``(op, dtensor_args) -> result``)."""
    shape = (ctx.world_size,) if mesh == "1d" else (2, 2)
    table = OPS_1D if mesh == "1d" else OPS_2D
    apply_op = resolve_injected(applier, default_apply_op, "op applier")
    return run_cases(ctx, shape, [(op_case_id(op, specs),
                                   lambda m, op=op, specs=specs: _op_case(ctx, op, specs, m, apply_op))
                                  for op, specs, _ in table])


def _close(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-5)


def op_verdict(op: str, specs: tuple[str, ...], expected_placement: str | None, record: dict) -> str | None:
    what = f"{op} on DTensor inputs placed {list(specs)}"
    if (split := disagreement(record)) is not None:
        return f"{what}: the ranks disagree ({split})"
    if "error" in record:
        return f"{what} raised {record['error']} (at {', '.join(record.get('where', []))})"
    if expected_placement is not None:
        want = [str(p) for p in placements(expected_placement)]
        if record["placements"] != want:
            return f"{what} gave output placements {record['placements']}, expected {want}"
    for i, (got, want) in enumerate(zip(record["full"], record["eager"])):
        if not _close(got, want):
            return f"{what}: output {i} is {got.tolist()}, eager gives {want.tolist()}"
    for i, (got, want) in enumerate(record["grads"]):
        if not _close(got, want):
            return f"{what}: gradient of operand {i} is {got.tolist()}, eager gives {want.tolist()}"
    return None


# -- random numbers --------------------------------------------------------------------------------

RANDOM_CASES = ("R", "S0")


def default_dropout(x):
    import torch

    return torch.nn.functional.dropout(x, p=0.5)


def _random_case(ctx, spec: str, mesh, dropout) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import distribute_tensor

    torch.manual_seed(1234)  # the same seed on every rank, as DTensor's random ops require
    x = distribute_tensor(torch.ones(8 * ctx.world_size, 16, device=ctx.device), mesh, placements(spec))
    mask = dropout(x).to_local() != 0
    gathered: list = [None] * ctx.world_size
    import torch.distributed as dist

    dist.all_gather_object(gathered, mask.cpu(), group=mesh.get_group())
    return {"masks": gathered}


def evaluate_random(ctx, dropper: str = "dtensor") -> dict[str, dict]:
    """Rank function: dropout (p=0.5) on a Replicate and a Shard(0) DTensor of ones, each rank's mask
    gathered. ``dropper``: ``"dtensor"`` (torch's dropout) or ``"package.module:ATTRIBUTE"``,
    ``(dtensor) -> dtensor``."""
    dropout = resolve_injected(dropper, default_dropout, "dropout")
    return run_cases(ctx, (ctx.world_size,), [(s, lambda m, s=s: _random_case(ctx, s, m, dropout))
                                              for s in RANDOM_CASES])


def random_verdict(spec: str, record: dict) -> str | None:
    import torch

    if "error" in record:
        return f"dropout on a {spec} DTensor raised {record['error']}"
    masks = record["masks"]
    same = [torch.equal(masks[0], m) for m in masks[1:]]
    if spec == "R" and not all(same):
        return (f"dropout on a Replicate DTensor gave different masks on ranks "
                f"{[r + 1 for r, s in enumerate(same) if not s]} than on rank 0: the result is not replicated")
    if spec == "S0" and any(same):
        return (f"dropout on a Shard(0) DTensor gave rank 0's shard the same mask as rank(s) "
                f"{[r + 1 for r, s in enumerate(same) if s]}: one mask repeated, not random values over the "
                "whole tensor")
    return None


# -- torch.compile ----------------------------------------------------------------------------------

def _compiled_model(x, w):
    import torch

    return torch.relu(x @ w).sum(dim=0)


def default_compile(fn):
    import torch

    return torch.compile(fn, fullgraph=True)


def evaluate_compiled(ctx, compiler: str = "dtensor") -> dict[str, dict]:
    """A small DTensor program (matmul, relu, sum over the sharded dim) compiled and eager. ``compiler``:
    ``"dtensor"`` (``torch.compile``) or ``"package.module:ATTRIBUTE"``, ``(fn) -> compiled fn``."""
    import torch

    compile_fn = resolve_injected(compiler, default_compile, "compiler")

    def case(mesh):
        from torch.distributed.tensor import distribute_tensor

        gen = _generator("compiled")
        x = torch.randn(8, 6, generator=gen, device="cpu").to(ctx.device)
        w = torch.randn(6, 4, generator=gen, device="cpu").to(ctx.device)
        dx, dw = distribute_tensor(x, mesh, placements("S0")), distribute_tensor(w, mesh, placements("R"))
        compiled = compile_fn(_compiled_model)(dx, dw)
        return {"compiled": compiled.full_tensor(), "eager": _compiled_model(x, w),
                "placements": [str(p) for p in compiled.placements]}

    return run_cases(ctx, (ctx.world_size,), [("matmul-relu-sum", case)])


def compiled_verdict(record: dict) -> str | None:
    if "error" in record:
        return f"torch.compile of a DTensor program raised {record['error']} (at {', '.join(record.get('where', []))})"
    if not _close(record["compiled"], record["eager"]):
        return f"compiled DTensor program gives {record['compiled'].tolist()}, eager {record['eager'].tolist()}"
    return None
