"""Rank functions of the parallelisms suite: DDP, FSDP2, tensor parallelism, pipelining, FSDP2 x TP.

Each trains ``_parallel_models``' small model for a few SGD steps over the pool's process group and
returns ``{"run": record, "reference": record, ...}`` where the reference trains the same initial model
in this one process on the concatenated (global) batch, on the same device, adding its gradients in
the run's order where it can (``data_parallel_step``; one backward per micro-batch). The part a broken
stand-in replaces is named by import path (``"torch"``: the real thing): a DDP communication hook,
the finalization call, the FSDP2 state-dict loader and mixed-precision policy, the Megatron region's
autograd functions, the pipeline's input feed.
"""

from __future__ import annotations

import copy

from conformance.suites import _parallel_models as models
from conformance.suites._parallel_models import BATCH_PER_RANK, STEPS, resolve


def _local(x, index: int, parts: int):
    return x.chunk(parts)[index]


def _global_batches(world: int, device, steps: int = STEPS):
    return [models.batch(step, BATCH_PER_RANK * world, device) for step in range(steps)]


def local_grads(model) -> dict:
    """This rank's own gradient tensors (a DTensor's local shard), with no collective: what manual
    finalization leaves before and after ``finalize_backward``."""
    return {name: None if p.grad is None else getattr(p.grad, "_local_tensor", p.grad).detach().cpu().clone()
            for name, p in model.named_parameters()}


def _rows_like(pending: dict, final: dict, rank: int, world: int) -> dict:
    """``pending`` (gradients before ``finalize_backward``) shaped like ``final`` (after it): a gradient
    FSDP2 still held unsharded (its reduce-scatter pending) is cut to this rank's rows, the dim-0 chunk
    that FSDP2 shards it to."""
    shaped = dict(pending)
    for name, g in pending.items():
        if g is not None and final.get(name) is not None and g.shape != final[name].shape:
            rows = g.chunk(world)
            shaped[name] = rows[rank] if rank < len(rows) else g[:0]
    return shaped


def _finalize_manually(model, wrapper, finish, work, ctx, before: list, after: list) -> None:
    """Record this rank's gradients, do other work, ``finish(wrapper)``, record them again (the first
    record cut to the second's shapes, ``_rows_like``)."""
    import torch

    pending = local_grads(model)
    torch.mm(work.t(), work)  # overlapped work between backward and finalization
    finish(wrapper)
    after.append(local_grads(model))
    before.append(_rows_like(pending, after[-1], ctx.rank, ctx.world_size))


# -- DDP ---------------------------------------------------------------------------------------------

def _torch_finalize(ddp_or_fsdp) -> None:
    ddp_or_fsdp.finalize_backward()


def ddp(ctx, *, bucket_cap_mb: float = 25.0, unused: bool = False, no_sync: bool = False, manual: bool = False,
        hook: str = "torch", finalize: str = "torch") -> dict:
    """DDP against the reference. ``no_sync``: each step accumulates two half batches, the first under
    ``no_sync``. ``manual``: manual backward finalization (torch >= 2.15), with the gradients read
    before ``finalize_backward`` (must not be final yet) and after (must be)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = models.net(ctx.device, unused=unused)
    reference = copy.deepcopy(model)
    device_ids = None if ctx.device.type == "cpu" else [ctx.device.index or 0]
    wrapped = DDP(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=unused)
    if hook != "torch":
        wrapped.register_comm_hook(None, resolve(hook, None, "DDP communication hook"))
    finish = resolve(finalize, _torch_finalize, "finalization")
    if manual:
        wrapped.require_manual_backward_finalization = True
    opt = torch.optim.SGD(wrapped.parameters(), lr=models.LR)
    batches = _global_batches(ctx.world_size, ctx.device)
    grads, before, after = [], [], []
    for x, y in batches:
        x, y = _local(x, ctx.rank, ctx.world_size), _local(y, ctx.rank, ctx.world_size)
        opt.zero_grad(set_to_none=True)
        if no_sync:  # two half batches; the first one's gradients stay local until the second's backward
            (xa, xb), (ya, yb) = x.chunk(2), y.chunk(2)
            with wrapped.no_sync():
                (models.mse(wrapped(xa), ya) / 2).backward()
            (models.mse(wrapped(xb), yb) / 2).backward()
        else:
            models.mse(wrapped(x), y).backward()
        if manual:
            _finalize_manually(model, wrapped, finish, x, ctx, before, after)
        grads.append(models.grads_of(model))
        opt.step()
    # Each rank's loss is its own part's: only gradients and parameters are compared with the reference.
    run = models.record(grads, models.params_of(model), [])
    ref = models.train_reference(reference, batches, data_parallel_step(ctx.world_size, parts=2 if no_sync else 1))
    ref["losses"] = []
    return {"run": run, "reference": ref, "before_finalize": before, "after_finalize": after}


# -- FSDP2 -------------------------------------------------------------------------------------------

LAYERS = ("fc0", "fc1", "fc2", "head")


def _torch_policy(mixed_precision: bool):
    """The contract's mixed precision: bfloat16 parameters, float32 reduction (else FSDP2's default)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision
            else MixedPrecisionPolicy())


def _shard(model, mesh, *, reshard_after_forward: bool = True, policy=None):
    from torch.distributed.fsdp import fully_shard

    policy = _torch_policy(False) if policy is None else policy
    for name in LAYERS:
        fully_shard(getattr(model, name), mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)


def data_parallel_step(world: int, *, parts: int = 1, low=None):
    """The reference's step, added up the way data parallelism adds it: each rank's chunk of the batch
    gives that rank's gradients (in ``parts`` pieces, each loss divided by ``parts`` and accumulated, as
    under ``no_sync``), which are summed in rank order and divided by the world size. ``low`` (FSDP2's
    mixed precision): each chunk runs in a copy of the model cast to ``low`` (inputs cast too), its
    gradients cast back to float32 before the sum."""
    import torch

    def step_loss(model, x, y):
        total, summed = 0.0, {name: None for name, _ in model.named_parameters()}
        for xr, yr in zip(x.chunk(world), y.chunk(world)):
            mine = model if low is None else copy.deepcopy(model).to(low)
            mine.zero_grad(set_to_none=True)
            for xp, yp in zip(xr.chunk(parts), yr.chunk(parts)):
                loss = models.mse(mine(xp if low is None else xp.to(low)), yp)
                (loss / parts).backward()
                total += float(loss) / parts
            for name, p in mine.named_parameters():
                if p.grad is not None:
                    g = p.grad.float()
                    summed[name] = g.clone() if summed[name] is None else summed[name] + g
        for name, p in model.named_parameters():
            p.grad = None if summed[name] is None else summed[name] / world
        return torch.tensor(total / world, device=x.device)

    return step_loss


def _torch_load_full(model, state_dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True))


def _local_shards(model) -> dict:
    return {name: p.to_local().detach().cpu().clone() for name, p in model.named_parameters()}


def fsdp(ctx, *, reshard_after_forward: bool = True, mixed_precision: bool = False, manual: bool = False,
         state_dict: bool = False, finalize: str = "torch", loader: str = "torch", policy: str = "torch") -> dict:
    """FSDP2 (``fully_shard`` per layer and at the root, with ``policy(mixed_precision)``'s
    ``MixedPrecisionPolicy``) against the reference. ``manual``:
    ``set_manual_backward_finalization`` (torch >= 2.15). ``state_dict``: after training, the full state
    dict must hold the trained parameters, and loading it into a differently initialised sharded model
    (``loader``) must give back every rank's shards."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = models.net(ctx.device)
    reference = copy.deepcopy(model)
    mp_policy = resolve(policy, _torch_policy, "mixed-precision policy")(mixed_precision)
    _shard(model, mesh, reshard_after_forward=reshard_after_forward, policy=mp_policy)
    finish = resolve(finalize, _torch_finalize, "finalization")
    if manual:
        model.set_manual_backward_finalization(True)
    opt = torch.optim.SGD(model.parameters(), lr=models.LR)
    batches = _global_batches(ctx.world_size, ctx.device)
    grads, before, after = [], [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        models.mse(model(_local(x, ctx.rank, ctx.world_size)), _local(y, ctx.rank, ctx.world_size)).backward()
        if manual:
            _finalize_manually(model, model, finish, x, ctx, before, after)
        grads.append(models.grads_of(model))
        opt.step()
    run = models.record(grads, models.params_of(model), [])
    step = data_parallel_step(ctx.world_size, low=torch.bfloat16 if mixed_precision else None)
    ref = models.train_reference(reference, batches, step)
    ref["losses"] = []
    result = {"run": run, "reference": ref, "before_finalize": before, "after_finalize": after,
              "shards": _local_shards(model)}
    if state_dict:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        result["full_state_dict"] = {name: t.detach().cpu().clone() for name, t in full.items()}
        fresh = models.net(ctx.device, seed=7)
        _shard(fresh, mesh, reshard_after_forward=reshard_after_forward, policy=mp_policy)
        resolve(loader, _torch_load_full, "state-dict loader")(fresh, full)
        result["loaded_shards"] = _local_shards(fresh)
    return result


# -- tensor parallelism ------------------------------------------------------------------------------

def _megatron_region():
    """Megatron's two autograd functions: identity forward with all-reduce backward (entering the
    region), all-reduce forward with identity backward (leaving it)."""
    import torch
    import torch.distributed as dist

    class CopyToRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
            return grad, None

    class ReduceFromRegion(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            x = x.contiguous().clone()
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return CopyToRegion.apply, ReduceFromRegion.apply


class MegatronRegion:
    """The suite's own Megatron-style region; a stand-in has the same two functions."""

    @staticmethod
    def copy_to_region(x, group):
        return _megatron_region()[0](x, group)

    @staticmethod
    def reduce_from_region(x, group):
        return _megatron_region()[1](x, group)


def _megatron(model, ctx, region):
    """``model`` with fc1 split by rows (colwise) and fc2 by columns (rowwise) by hand, fc2's bias added
    after the reduction; its sharded parameters replace fc1's and fc2's."""
    import torch
    from torch import nn

    group, rank, world = ctx.group, ctx.rank, ctx.world_size
    with torch.no_grad():
        model.fc1.weight = nn.Parameter(model.fc1.weight.chunk(world, 0)[rank].clone())
        model.fc1.bias = nn.Parameter(model.fc1.bias.chunk(world, 0)[rank].clone())
        model.fc2.weight = nn.Parameter(model.fc2.weight.chunk(world, 1)[rank].clone())

    def forward(x):
        h = torch.relu(model.fc0(x))
        h = region.copy_to_region(h, group)
        h = torch.relu(torch.nn.functional.linear(h, model.fc1.weight, model.fc1.bias))
        h = region.reduce_from_region(torch.nn.functional.linear(h, model.fc2.weight), group) + model.fc2.bias
        return model.head(torch.relu(h))

    return forward


def _gathered(t, dim: int, ctx):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(ctx.world_size)]
    dist.all_gather(parts, t.contiguous(), group=ctx.group)
    return torch.cat(parts, dim)


_MEGATRON_SPLIT = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1}


def _megatron_full(named, ctx) -> dict:
    """The Megatron model's tensors (gradients or parameters) gathered to full size."""
    return {name: None if t is None else (_gathered(t.detach(), _MEGATRON_SPLIT[name], ctx)
                                          if name in _MEGATRON_SPLIT else t.detach()).cpu().clone()
            for name, t in named}


def tensor_parallel(ctx, *, style: str = "parallelize_module", region: str = "torch") -> dict:
    """fc1 colwise and fc2 rowwise over every rank (``parallelize_module`` or the hand-written Megatron
    region ``region``), every rank on the same global batch, against the reference."""
    import torch

    model = models.net(ctx.device)
    reference = copy.deepcopy(model)
    if style == "parallelize_module":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        forward = model
        full_grads, full_params = (lambda: models.grads_of(model)), (lambda: models.params_of(model))
    else:
        forward = _megatron(model, ctx, resolve(region, MegatronRegion, "Megatron region"))
        full_grads = lambda: _megatron_full(((n, p.grad) for n, p in model.named_parameters()), ctx)  # noqa: E731
        full_params = lambda: _megatron_full(model.named_parameters(), ctx)  # noqa: E731
    opt = torch.optim.SGD(model.parameters(), lr=models.LR)
    batches = _global_batches(ctx.world_size, ctx.device)
    grads, losses = [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = models.mse(forward(x), y)
        loss.backward()
        grads.append(full_grads())
        losses.append(float(models.local_tensor(loss)))
        opt.step()
    run = models.record(grads, full_params(), losses)
    return {"run": run, "reference": models.train_reference(reference, batches)}


# -- pipelining --------------------------------------------------------------------------------------

MICROBATCHES = 4
LOOPED = ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS")


def _torch_feed(x, microbatches: int):
    return x


def pipeline(ctx, *, schedule: str = "ScheduleGPipe", feed: str = "torch") -> dict:
    """The blocks model split into one stage per rank (two per rank, round robin, for a looped schedule),
    ``MICROBATCHES`` micro-batches; the last stage's per-micro-batch losses and every stage's gradients
    against the unsplit model. ``feed(x, microbatches)`` is what the first stage is given."""
    import torch.distributed.pipelining as pipelining

    per_rank = 2 if schedule in LOOPED else 1
    count = ctx.world_size * per_rank
    model = models.blocks(count, ctx.device)
    reference = copy.deepcopy(model)
    mine = [ctx.rank + k * ctx.world_size for k in range(per_rank)]
    stages = [pipelining.PipelineStage(model[i], i, count, ctx.device, group=ctx.group) for i in mine]
    cls = getattr(pipelining, schedule)
    runner = cls(stages if per_rank > 1 else stages[0], n_microbatches=MICROBATCHES, loss_fn=models.mse)
    x, y = models.batch(0, 2 * MICROBATCHES, ctx.device, width=models.IN)
    losses: list = []
    first = (resolve(feed, _torch_feed, "pipeline feed")(x, MICROBATCHES),) if 0 in mine else ()
    runner.step(*first, **({"target": y, "losses": losses} if count - 1 in mine else {}))
    names = [f"{i}.{name}" for i in mine for name, _ in model[i].named_parameters()]
    grads = {name: p.grad.detach().cpu().clone() for name, p in model.named_parameters() if name in names}
    run = models.record([grads], {}, [float(loss) for loss in losses])

    parts: list = []

    def step_loss(m, xs, ys):  # the unsplit model, one backward per micro-batch in order (each loss recorded)
        for xm, ym in zip(xs.chunk(MICROBATCHES), ys.chunk(MICROBATCHES)):
            loss = models.mse(m(xm), ym)
            parts.append(float(loss))
            (loss / MICROBATCHES).backward()
        return sum(parts) / MICROBATCHES

    ref = models.train_reference(reference, [(x, y)], step_loss)
    ref = models.record([{n: g for n, g in ref["grads"][0].items() if n in names}], {},
                        parts if count - 1 in mine else [])
    return {"run": run, "reference": ref}


# -- FSDP2 x TP on a 2-D mesh ------------------------------------------------------------------------

def fsdp_tp(ctx) -> dict:
    """fc1/fc2 tensor parallel along the mesh's ``tp`` dim, every layer and the root fully sharded along
    ``dp``; each ``dp`` coordinate trains on its part of the global batch."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dp = ctx.world_size // 2
    mesh = init_device_mesh(ctx.device.type, (dp, 2), mesh_dim_names=("dp", "tp"))
    model = models.net(ctx.device)
    reference = copy.deepcopy(model)
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    _shard(model, mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=models.LR)
    batches = [models.batch(step, BATCH_PER_RANK * dp, ctx.device) for step in range(STEPS)]
    coordinate = mesh["dp"].get_local_rank()
    grads = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        models.mse(model(_local(x, coordinate, dp)), _local(y, coordinate, dp)).backward()
        grads.append(models.grads_of(model))
        opt.step()
    ref = models.train_reference(reference, batches)
    ref["losses"] = []
    return {"run": models.record(grads, models.params_of(model), []), "reference": ref}
