"""Rank functions of the ``dtensor_promises`` suite: autograd through ``redistribute``, ops on ``Partial``
placements, ``_StridedShard``, uneven sharding on a 2-D mesh, and device-mesh slicing and flattening.

Redistributions go through ``redistributor`` (``(dtensor, mesh, placements) -> DTensor``; ``"dtensor"``:
``DTensor.redistribute``) and sub-mesh groups through ``grouper`` (``(mesh) -> ProcessGroup``;
``"dtensor"``: ``DeviceMesh.get_group``), so the project's tests can hand in broken ones. Every function
returns CPU tensors (or an error string) for the controller to compare with eager torch.
"""

from __future__ import annotations

from conformance.suites._dtensor_mesh import device_mesh, error_record, resolve_injected


def _redistribute(dtensor, mesh, placements):
    return dtensor.redistribute(mesh, placements)


def _group(mesh):
    return mesh.get_group()


def full_input(rows: int, cols: int, salt: int = 0):
    """A float64 tensor of distinct values, the same on every rank (CPU)."""
    import torch

    with torch.device("cpu"):
        return (torch.arange(rows * cols, dtype=torch.float64).view(rows, cols) * 0.5 + salt) % 7.25


def placement(name: str):
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if name == "R" else Shard(int(name[1:]))


def backward_through_redistribute_on_rank(ctx, src: str, dst: str, redistributor: str = "dtensor"):
    """x (placed ``src``) -> redistribute to ``dst`` -> (y * w).sum(): ``{"grad": x.grad in full, "placements":
    x.grad's}`` or ``{"error": ...}``; eager's gradient is w."""
    from torch.distributed.tensor import distribute_tensor

    redistribute = resolve_injected(redistributor, _redistribute, "redistributor")
    world = ctx.world_size
    mesh = device_mesh(ctx, (world,))
    try:
        x = distribute_tensor(full_input(4 * world, 2 * world).to(ctx.device), mesh, [placement(src)]).requires_grad_()
        w = distribute_tensor(full_input(4 * world, 2 * world, 3).to(ctx.device), mesh, [placement(dst)])
        y = redistribute(x, mesh, [placement(dst)])
        (y * w).sum().full_tensor().backward()
        if x.grad is None:
            return {"grad": None, "placements": None}
        return {"grad": x.grad.full_tensor().cpu(), "placements": [str(p) for p in x.grad.placements]}
    except Exception as exc:  # noqa: BLE001 - the error is the record
        return error_record(exc)


PARTIAL_OPS = ("add", "sub", "mul_by_scalar", "neg")


def partial_ops_on_rank(ctx, redistributor: str = "dtensor"):
    """Ops on two Partial(sum) DTensors whose locals differ per rank; each result reduced to Replicate:
    ``{op: full result}`` (or the error)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    redistribute = resolve_injected(redistributor, _redistribute, "redistributor")
    mesh = device_mesh(ctx, (ctx.world_size,))
    p, q = (DTensor.from_local(t.to(ctx.device), mesh, [Partial()], run_check=False) for t in partial_locals(ctx.rank))
    ops = {"add": lambda: p + q, "sub": lambda: p - q, "mul_by_scalar": lambda: p * 3, "neg": lambda: -p}
    out = {}
    for name in PARTIAL_OPS:
        try:
            out[name] = redistribute(ops[name](), mesh, [Replicate()]).to_local().cpu()
        except Exception as exc:  # noqa: BLE001
            out[name] = error_record(exc)["error"]
    return out


def partial_locals(rank: int):
    return full_input(3, 4, rank) * (rank + 1), full_input(3, 4, 2 * rank + 1) - rank


def strided_shard_on_rank(ctx, split_factor: int, redistributor: str = "dtensor"):
    """Replicate -> [_StridedShard(0, split_factor)] -> Replicate: ``{"local": ..., "round_trip": ...}``, a
    string when this torch has no _StridedShard, or ``{"error": ...}``."""
    import torch
    from torch.distributed.tensor import Replicate, distribute_tensor

    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed.tensor.placement_types._StridedShard"
    redistribute = resolve_injected(redistributor, _redistribute, "redistributor")
    world = ctx.world_size
    mesh = device_mesh(ctx, (world,))
    try:
        full = distribute_tensor(full_input(split_factor * world * 2, 3).to(ctx.device), mesh, [Replicate()])
        # torch's _StridedShard path creates index tensors on the default device: a user's is the CPU (the
        # project's own runs make it meta, to catch bodies that forget ctx.device).
        with torch.device("cpu"):
            strided = redistribute(full, mesh, [_StridedShard(0, split_factor=split_factor)])
            back = redistribute(strided, mesh, [Replicate()])
        return {"local": strided.to_local().cpu(), "round_trip": back.to_local().cpu()}
    except Exception as exc:  # noqa: BLE001
        return error_record(exc)


def uneven_2d_on_rank(ctx, rows: int, cols: int, redistributor: str = "dtensor"):
    """On a 2 x 2 mesh: Replicate -> [Shard(0), Shard(1)] -> Replicate of a rows x cols tensor that neither
    mesh dim divides: ``{"coordinate": this rank's mesh coordinate, "local": ..., "round_trip": ...}``."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    redistribute = resolve_injected(redistributor, _redistribute, "redistributor")
    mesh = device_mesh(ctx, (2, 2))
    try:
        full = distribute_tensor(full_input(rows, cols).to(ctx.device), mesh, [Replicate(), Replicate()])
        sharded = redistribute(full, mesh, [Shard(0), Shard(1)])
        back = redistribute(sharded, mesh, [Replicate(), Replicate()])
        return {"coordinate": mesh.get_coordinate(), "local": sharded.to_local().cpu(), "round_trip": back.to_local().cpu()}
    except Exception as exc:  # noqa: BLE001
        return error_record(exc)


def mesh_slices_on_rank(ctx, grouper: str = "dtensor"):
    """A ("dp", "tp") mesh of 2 x world/2 (1 x 2 at 2 ranks): the sizes of mesh["dp"], mesh["tp"] and
    the flattened ("dp", "tp"), and a SUM all_reduce of this rank's number over each one's group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    group_of = resolve_injected(grouper, _group, "grouper")
    world = ctx.world_size
    shape = (2, world // 2) if world % 2 == 0 and world >= 4 else (1, world)
    mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=("dp", "tp"))
    if not hasattr(mesh, "_flatten"):
        return f"torch {torch.__version__} has no DeviceMesh._flatten"
    out = {"shape": shape}
    for name, sub in (("dp", mesh["dp"]), ("tp", mesh["tp"]), ("dp_tp", mesh["dp", "tp"]._flatten("dp_tp"))):
        t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
        dist.all_reduce(t, group=group_of(sub))
        out[name] = {"size": sub.size(), "sum": t.item(), "ranks": sub.mesh.flatten().tolist()}
    return out


def _to_local(dtensor):
    return dtensor.to_local()


def _from_local(local, mesh, placements):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, mesh, placements)


def _first_piece(dtensor, how: str):
    """The first of the pieces ``how`` makes of ``dtensor``'s rows: ``split`` (blocks of 2) or ``unbind``."""
    import torch

    return torch.split(dtensor, 2, dim=0)[0] if how == "split" else dtensor.unbind(0)[0]


# Each case and the gradients it asks for, in the order its record lists them.
LOCAL_GRADIENT_CASES = {"mixed_paths": ["x.grad"], "unused_dtensor_path": ["x.grad"], "allow_unused": ["a's", "b's"],
                        "unused_split_output": ["the input's"], "unused_unbind_output": ["the input's"]}


def local_gradients_on_rank(ctx, case: str, to_local: str = "dtensor", from_local: str = "dtensor",
                            splitter: str = "dtensor"):
    """Gradients across ``from_local``/``to_local`` where DTensors meet plain tensors or a gradient is None:
    ``{"grads": [each gradient asked for: a CPU tensor (a DTensor's in full) or None]}`` or ``{"error": ...}``.

    ``mixed_paths``: a plain leaf x (this rank's 2 x 3) reaches the loss directly (x * 3) and through
    ``from_local(x, [Shard(0)]) * 2 -> to_local``: x.grad is 5 everywhere. ``unused_dtensor_path``: the
    DTensor made from x never reaches the loss: x.grad is 3. ``allow_unused``: ``autograd.grad`` of
    ``to_local(a * 2).sum()`` for DTensor leaves a and b: a's gradient is 2, b's None. ``unused_split_output``
    / ``unused_unbind_output``: a DTensor (Shard(1)) split into row blocks (or unbound into rows), only the
    first reaching the loss: the others' None gradients count as zeros, so the input's gradient is 1 on the
    first rows and 0 elsewhere."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    to_local_fn = resolve_injected(to_local, _to_local, "to_local")
    from_local_fn = resolve_injected(from_local, _from_local, "from_local")
    first_piece = resolve_injected(splitter, _first_piece, "splitter")
    mesh = device_mesh(ctx, (ctx.world_size,))
    try:
        if case in ("mixed_paths", "unused_dtensor_path"):
            x = torch.ones(2, 3, device=ctx.device, requires_grad=True)
            through = from_local_fn(x, mesh, [Shard(0)] if case == "mixed_paths" else [Replicate()]) * 2
            loss = (x * 3).sum() + (to_local_fn(through).sum() if case == "mixed_paths" else 0)
            loss.backward()
            return {"grads": [None if x.grad is None else x.grad.cpu()]}
        full = full_input(4, 2 * ctx.world_size).to(ctx.device)
        if case == "allow_unused":
            a, b = (distribute_tensor(full, mesh, [Shard(0)]).requires_grad_() for _ in range(2))
            grads = torch.autograd.grad(to_local_fn(a * 2).sum(), [a, b], allow_unused=True)
            return {"grads": [None if g is None else g.full_tensor().cpu() for g in grads]}
        c = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
        first = first_piece(c, "split" if case == "unused_split_output" else "unbind")
        to_local_fn(first).sum().backward()
        return {"grads": [None if c.grad is None else c.grad.full_tensor().cpu()]}
    except Exception as exc:  # noqa: BLE001 - the error is the record
        return error_record(exc)


def local_gradients_expected(case: str, world: int) -> list:
    """What eager autograd gives for ``case`` (see ``local_gradients_on_rank``)."""
    import torch

    if case == "mixed_paths":
        return [torch.full((2, 3), 5.0)]
    if case == "unused_dtensor_path":
        return [torch.full((2, 3), 3.0)]
    if case == "allow_unused":
        return [torch.full((4, 2 * world), 2.0, dtype=torch.float64), None]
    want = torch.zeros(4, 2 * world, dtype=torch.float64)
    want[: 2 if case == "unused_split_output" else 1] = 1.0
    return [want]
