"""Deliberately broken pieces of data, tensor and pipeline parallelism, handed to the parallelisms suite
by import path (``"tests.conformance.suites._broken_parallel:NAME"``); every rank imports this module itself."""

from __future__ import annotations


class MissingBackwardAllReduce:
    """A Megatron region whose entry forgets the all-reduce of its backward: the layers before the
    region get only this rank's part of their gradient."""

    @staticmethod
    def copy_to_region(x, group):
        return x

    @staticmethod
    def reduce_from_region(x, group):
        from conformance.suites._parallel_bodies import MegatronRegion

        return MegatronRegion.reduce_from_region(x, group)


def reversed_bucket_order(state, bucket):
    """A DDP communication hook that averages a bucket, then hands its parameters' gradients back in
    reverse order (each parameter gets another's slice of the flat buffer)."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def reorder(done):
        flat = done.value()[0]
        pieces = list(flat.split([g.numel() for g in bucket.gradients()]))
        return torch.cat(pieces[::-1])

    return future.then(reorder)


def floor_shards(model, state_dict) -> None:
    """Loads a full state dict into an FSDP2 model with ``rows // world`` rows per rank, as if no
    parameter needed padding: the rows of an uneven parameter's padded last shards go wrong."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local()
            world, rank = param.device_mesh.size(), param.device_mesh.get_local_rank()
            rows = state_dict[name].shape[0] // world
            mine = state_dict[name][rank * rows:(rank + 1) * rows][:local.shape[0]]
            local.zero_()
            local[:mine.shape[0]].copy_(mine)


def reversed_microbatches(x, microbatches: int):
    """A first stage that takes its micro-batches in reverse order."""
    import torch

    return torch.cat(list(x.chunk(microbatches))[::-1])


def finalize_before_the_reduction(module) -> None:
    """A ``finalize_backward`` that returns with each rank's gradients as they were before the reduction
    (this rank's part of a still unreduced, unsharded gradient where FSDP2 had one pending)."""
    import torch

    saved = {name: None if p.grad is None else getattr(p.grad, "_local_tensor", p.grad).detach().clone()
             for name, p in module.named_parameters()}
    module.finalize_backward()
    with torch.no_grad():
        for name, param in module.named_parameters():
            grad, local = saved[name], None if param.grad is None else getattr(param.grad, "_local_tensor", param.grad)
            if grad is None or local is None:
                param.grad = None
            elif grad.shape == local.shape:
                local.copy_(grad)
            else:  # the unsharded gradient FSDP2 had yet to reduce-scatter: this rank's rows of it
                mesh = param.device_mesh
                rows = grad.chunk(mesh.size())[mesh.get_local_rank()]
                local.zero_()
                local[:rows.shape[0]].copy_(rows)


def bfloat16_reduce(mixed_precision: bool):
    """An FSDP2 mixed-precision policy that reduces in bfloat16 instead of the contract's float32."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
