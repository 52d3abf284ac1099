"""DTensor argmax/argmin: the case matrix, the rank function that evaluates it, and the verdict per case.

Triggered by ``test_dtensor_argminmax``. One ``evaluate_matrix`` call runs every case of one mesh on
every rank (a few thousand small ops: far cheaper than a ranks.run per case), catching each case's
exception inside the rank and agreeing on each outcome (``_dtensor_mesh.run_cases``), so that a case
that crashes, even on one rank only, cannot take the process group down or hang its peers. Each case
records what eager torch says on the full tensor (on the same device) and what the DTensor op gave:
its placements and its full tensor, or the error it raised. ``verdict`` (controller side) turns one
case's record into None (conformant) or a one-paragraph explanation.

The op under test is reached through a handler name: ``"dtensor"`` (``torch.argmax``/``argmin`` on
the DTensor, the default) or ``"package.module:ATTRIBUTE"``, a function ``(dtensor, op, dim, keepdim)
-> DTensor`` the project's tests use to show a broken handler is caught.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from conformance.suites._dtensor_mesh import disagreement, error_record, resolve_injected, run_cases

__all__ = ["Case", "cases", "case_key", "evaluate_matrix", "verdict", "MESHES", "COMPILED_CASES", "evaluate_compiled",
           "compiled_verdict"]

OPS = ("argmax", "argmin")
DTYPES = ("float32", "bfloat16", "int64", "bool")
DIMS = (None, 0, 1, -1)
MATRIX_DATA = ("random", "ties_in_shard", "ties_across_shards", "all_equal", "nan", "neg_inf", "uneven_5x7")
VECTOR_DATA = ("1d", "1d_uneven_7")
FLOAT_ONLY = {"nan", "neg_inf"}
BOOL_DATA = {"random", "uneven_5x7"}  # eager raises for every bool input: two shapes show whether DTensor does too

# Placement ids per mesh; "Partial(sum)" is built from partial values and redistributed by the op.
MESHES = {
    "1d": ("Replicate()", "Shard(0)", "Shard(1)", "Partial(sum)"),
    "2d": ("[Shard(0),Shard(1)]", "[Replicate(),Shard(0)]", "[Shard(0),Shard(0)]", "[Shard(1),Shard(1)]"),
}


@dataclass(frozen=True)
class Case:
    op: str
    placement: str
    dim: int | None
    keepdim: bool
    data: str
    dtype: str

    @property
    def id(self) -> str:
        """``Shard(1)-dim=None-ties_across_shards-float32`` (``dim=0,keepdim`` when keepdim)."""
        return f"{self.placement}-dim={self.dim}{',keepdim' if self.keepdim else ''}-{self.data}-{self.dtype}"


def cases(mesh: str) -> list[Case]:
    """Every case of one mesh, in a fixed order."""
    out = []
    for op in OPS:
        for placement in MESHES[mesh]:
            for dtype in DTYPES:
                for data in MATRIX_DATA + VECTOR_DATA:
                    vector = data in VECTOR_DATA
                    if dtype != "bool" and data in FLOAT_ONLY and dtype not in ("float32", "bfloat16"):
                        continue
                    if dtype == "bool" and data not in BOOL_DATA:
                        continue
                    if vector and "Shard(1)" in placement:
                        continue  # a 1-D tensor has no dim 1 to shard
                    for dim in DIMS:
                        if vector and dim == 1:
                            continue
                        for keepdim in (False, True):
                            out.append(Case(op, placement, dim, keepdim, data, dtype))
    return out


# -- data -----------------------------------------------------------------------------------------

# Every row and every column holds its maximum (3) in both halves, and the first 3 in row-major
# order lies in the second half of the columns, while rank 0's half of the columns holds a 3 later.
_TIES_ACROSS = [[1, 0, 2, 3, 0, 3],
                [3, 3, 3, 1, 3, 0],
                [0, 3, 1, 3, 2, 3],
                [3, 1, 3, 2, 3, 0]]


def global_tensor(data: str, dtype_name: str, device="cpu"):
    """The full input tensor of a case (the same on every rank), on ``device``. argmin cases use its
    negation. Drawn on the host (a device's own generator would give other values), then moved."""
    import torch

    gen = torch.Generator().manual_seed(7)
    if data in ("1d", "1d_uneven_7"):
        values = torch.randperm(8 if data == "1d" else 7, generator=gen, device="cpu").float()
    elif data == "uneven_5x7":
        values = torch.randperm(35, generator=gen, device="cpu").float().view(5, 7)
    elif data == "ties_across_shards":
        values = torch.tensor(_TIES_ACROSS, dtype=torch.float32, device="cpu")
    elif data == "all_equal":
        values = torch.ones(4, 6, device="cpu")
    else:
        values = torch.randperm(24, generator=gen, device="cpu").float().view(4, 6)
        if data == "ties_in_shard":  # the extremes tie inside one shard: row 0 cols 0-1 (max), row 1 cols 0-1 (min)
            values[0, :2] = 30.0
            values[1, :2] = -30.0
        elif data == "nan":  # the first NaN (row-major) is in the second half of the columns
            values[0, 4] = values[2, 1] = values[3, 3] = float("nan")
        elif data == "neg_inf":
            values[0, 5] = values[1, 0] = values[3, 2] = float("-inf")
    if dtype_name == "bool":
        return (values > values.nan_to_num().median()).to(device)
    return values.to(device=device, dtype=getattr(torch, dtype_name))


def _case_input(case: Case, device):
    tensor = global_tensor(case.data, case.dtype, device)
    if case.op == "argmin":
        tensor = ~tensor if case.dtype == "bool" else -tensor
    return tensor


# -- on the ranks ---------------------------------------------------------------------------------

def _placements(placement: str) -> list:
    """``"[Shard(0),Replicate()]"`` or ``"Shard(1)"`` -> placement objects."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    def one(name: str):
        if name == "Replicate()":
            return Replicate()
        if name == "Partial(sum)":
            return Partial()
        return Shard(int(name.removeprefix("Shard(").removesuffix(")")))

    return [one(name) for name in placement.strip("[]").split(",")]


def _distribute(tensor, device_mesh, placement: str, rank: int):
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    placements = _placements(placement)
    if placement == "Partial(sum)":
        # Rank 0 holds the whole value and the others zero (False): the sum is exact for every dtype,
        # NaN and -inf included.
        local = tensor if rank == 0 else torch.zeros_like(tensor)
        return DTensor.from_local(local, device_mesh, placements, run_check=False)
    # Every rank built the same full tensor (global_tensor): each keeps its own shard rather than
    # receiving it from rank 0, a scatter per case and mesh dim that this suite does not check.
    return distribute_tensor(tensor, device_mesh, placements, src_data_rank=None)


def default_handler(dtensor, op: str, dim, keepdim: bool):
    import torch

    return getattr(torch, op)(dtensor, dim=dim, keepdim=keepdim)


def resolve_handler(name: str) -> Callable:
    return resolve_injected(name, default_handler, "argmax/argmin handler")


def case_key(case: Case) -> str:
    return f"{case.op}[{case.id}]"


MESH_SHAPES = {"1d": None, "2d": (2, 2)}


def _evaluate_case(ctx, case: Case, handle: Callable, mesh) -> dict[str, Any]:
    import torch

    record: dict[str, Any] = {}
    full_input = _case_input(case, ctx.device)
    try:
        record["eager"] = getattr(torch, case.op)(full_input, dim=case.dim, keepdim=case.keepdim)
    except Exception as exc:  # eager's refusal is the reference
        record["eager_error"] = error_record(exc)["error"]
    try:
        dtensor = _distribute(full_input, mesh, case.placement, ctx.rank)
        result = handle(dtensor, case.op, case.dim, case.keepdim)
        record["placements"] = [str(p) for p in result.placements]
        record["shard_dims"] = [getattr(p, "dim", None) for p in result.placements]
        record["partial"] = [p.is_partial() for p in result.placements]
        record["full"] = result.full_tensor()
    except Exception as exc:  # the DTensor op's error is this case's result
        record.update(error_record(exc))
    return record


def evaluate_matrix(ctx, mesh: str, handler: str = "dtensor", only: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Rank function: every case of ``mesh`` (or those whose ``case_key`` is in ``only``);
    ``{case_key: record}``, the ranks agreeing on each case's outcome (``_dtensor_mesh.run_cases``).

    A record holds ``eager`` (the reference tensor, or ``eager_error``) and ``placements`` +
    ``full`` (the DTensor result gathered), or ``error``; ``peers`` when the ranks' outcomes differ.
    """
    handle = resolve_handler(handler)
    shape = MESH_SHAPES[mesh] or (ctx.world_size,)
    selected = [c for c in cases(mesh) if only is None or case_key(c) in only]
    return run_cases(ctx, shape, [(case_key(c), lambda m, c=c: _evaluate_case(ctx, c, handle, m)) for c in selected])


def verdict(case: Case, record: dict) -> str | None:
    """None when DTensor behaved as eager did on the full tensor; else what went wrong."""
    what = (f"torch.{case.op}(DTensor {case.placement}, dim={case.dim}, keepdim={case.keepdim}) on "
            f"{case.data} {case.dtype} data")
    if (split := disagreement(record)) is not None:
        return f"{what}: the ranks disagree ({split}); the next case ran on a fresh mesh"
    if "eager_error" in record:
        if "error" in record:
            return None
        return (f"{what} returned {record['full'].tolist()} (placements {record['placements']}), "
                f"but eager raises on the full tensor: {record['eager_error']}")
    if "error" in record:
        where = ", ".join(record.get("where", []))
        return (f"{what} raised {record['error']} (at {where}); eager on the full tensor gives "
                f"{record['eager'].tolist()}")
    full, expected = record["full"], record["eager"]
    ndim = expected.dim()
    bad_placement = [p for p, d, partial in zip(record["placements"], record["shard_dims"], record["partial"])
                     if partial or (d is not None and not 0 <= d < max(ndim, 1))]
    if bad_placement:
        return f"{what} returned invalid output placements {record['placements']} for a {ndim}-d index tensor"
    if full.dtype != expected.dtype or full.shape != expected.shape or not bool((full == expected).all()):
        return (f"{what} returned {full.tolist()} ({full.dtype}, shape {tuple(full.shape)}), eager on the full "
                f"tensor gives {expected.tolist()} ({expected.dtype}, shape {tuple(expected.shape)}); input "
                f"{global_tensor(case.data, case.dtype).tolist() if case.op == 'argmax' else _case_input(case, 'cpu').tolist()}")
    return None


# -- torch.compile against eager ------------------------------------------------------------------

# (op, dim, data): op is argmax/argmin or min/max (their .indices, with a dim).
COMPILED_CASES = [
    *[(op, dim, "bool") for op in ("argmax", "argmin") for dim in (None, 1)],
    *[(op, dim, "bool") for op in ("min", "max") for dim in (0, 1)],
    *[(op, 1, "bool_row") for op in ("min", "max")],
    *[(op, dim, "ties_across_shards-float32") for op in ("argmax", "argmin", "min", "max") for dim in (0, 1)],
    *[(op, None, "ties_across_shards-float32") for op in ("argmax", "argmin")],
]

_BOOL_INPUT = [[True, True, False, True, False, True, True],
               [False, True, True, True, True, False, True],
               [True, True, True, True, False, False, False]]
_BOOL_ROW = [[True, True, False, True, False]]  # Inductor 2.13 gives min(1).indices [0], eager [2]


def compiled_case_id(op: str, dim, data: str) -> str:
    return f"{op}-dim={dim}-{data}"


def _apply(op: str, x, dim):
    if op in ("min", "max"):
        return getattr(x, op)(dim).indices
    return getattr(x, op)() if dim is None else getattr(x, op)(dim)


def _compile_groups() -> list[tuple[str, list[tuple]]]:
    """Cases compiled together, since compiling is the slow part: one graph per input for the ops
    eager accepts, and one for the ops eager refuses (bool argmax/argmin: that graph must raise)."""
    groups: dict[tuple, list[tuple]] = {}
    for op, dim, data in COMPILED_CASES:
        refused = data.startswith("bool") and op in ("argmax", "argmin")
        groups.setdefault((data, refused), []).append((op, dim, data))
    return [(data, members) for (data, _), members in groups.items()]


def evaluate_compiled(ctx) -> dict[str, dict] | None:
    """Rank function (rank 0 works, the others wait): each compiled op against eager on the same input."""
    import torch

    if ctx.rank != 0:
        return None
    inputs = {"bool": torch.tensor(_BOOL_INPUT, device=ctx.device),
              "bool_row": torch.tensor(_BOOL_ROW, device=ctx.device),
              "ties_across_shards-float32": torch.tensor(_TIES_ACROSS, dtype=torch.float32, device=ctx.device)}
    records: dict[str, dict] = {}
    for data, members in _compile_groups():
        x = inputs[data]
        specs = [(op, dim) for op, dim, _ in members]
        ids = [compiled_case_id(op, dim, data) for op, dim, _ in members]
        for case_id, (op, dim) in zip(ids, specs):
            records[case_id] = {}
            try:
                records[case_id]["eager"] = _apply(op, x, dim)
            except Exception as exc:
                records[case_id]["eager_error"] = error_record(exc)["error"]
        try:
            torch._dynamo.reset()
            compiled = torch.compile(lambda t: tuple(_apply(op, t, dim) for op, dim in specs),
                                     fullgraph=True, dynamic=False)
            for case_id, value in zip(ids, compiled(x)):
                records[case_id]["compiled"] = value
        except Exception as exc:
            for case_id in ids:
                records[case_id]["error"] = error_record(exc)["error"]
    return records


def compiled_verdict(case_id: str, record: dict) -> str | None:
    what = f"torch.compile({case_id})"
    if "eager_error" in record:
        if "error" in record:
            return None
        return f"{what} returned {record['compiled'].tolist()}, but eager raises: {record['eager_error']}"
    if "error" in record:
        return f"{what} raised {record['error']}; eager gives {record['eager'].tolist()}"
    if not torch_equal(record["compiled"], record["eager"]):
        return f"{what} returned {record['compiled'].tolist()}, eager gives {record['eager'].tolist()}"
    return None


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
