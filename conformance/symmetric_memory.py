"""The symmetric-memory operations the ``symmetric_memory`` suite tests, behind one small interface.

Rank functions of ``conformance/suites/test_symmetric_memory.py`` take an ``impl`` name and reach
symmetric memory only through the ``SymmetricMemory`` object that ``resolve(impl)(ctx)`` builds on
the rank: ``allocate``, ``rendezvous``, ``put_signal``, ``wait_signal``, ``barrier``, the collectives
on symmetric buffers (``OPERATIONS``) and ``unsupported``. ``"torch"``
(the default) is the real thing, ``torch.distributed._symmetric_memory`` over the backend's process
group, each operation a thin call of torch's own function or ``torch.ops.symm_mem`` op with the group's
name. Any other name is an import path ``"package.module:ATTRIBUTE"`` naming a class with the same
methods, which the rank processes import themselves: the project's own tests use this to run the
very same test bodies against a CPU reference implementation and against deliberately broken ones.
Nothing here imports torch at module level.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence

__all__ = ["METHODS", "OPERATIONS", "SymmetricMemory", "TorchSymmetricMemory", "resolve"]

# The collectives on symmetric buffers, by the name of their torch.ops.symm_mem op.
OPERATIONS = ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_",
              "_low_contention_all_gather", "_low_contention_reduce_scatter", "fused_all_gather_matmul",
              "get_remote_tensors")
METHODS = ("allocate", "rendezvous", "put_signal", "wait_signal", "barrier", "one_shot_all_reduce",
           "two_shot_all_reduce_", "multimem_all_reduce_", "low_contention_all_gather",
           "low_contention_reduce_scatter", "fused_all_gather_matmul", "get_remote_tensors", "unsupported")


class SymmetricMemory(Protocol):
    """What a symmetric-memory implementation offers one rank (built per rank from its RankContext).

    * ``allocate(shape, dtype)`` -> a tensor on this rank's device that may be rendezvoused;
    * ``rendezvous(tensor, group=None)`` -> a handle (``rank``, ``world_size`` within the group);
      collective over ``group`` (default: the rank's group); every member passes a tensor of the same
      shape and dtype;
    * ``put_signal(src, hdl, peer)``: copy ``src`` into ``peer``'s buffer of ``hdl``, then signal
      ``peer``; each signal is consumed by exactly one ``wait_signal``;
    * ``wait_signal(hdl, peer)``: block until ``peer`` has signalled this rank on ``hdl``; the
      buffer then holds what ``peer`` put;
    * ``barrier()``: every rank of the group has arrived, and earlier puts are complete.

    The collectives take a symmetric tensor (from ``allocate``; ``fused_all_gather_matmul``'s ``A``
    may be any tensor) and run over ``group`` (default: the rank's group), every member calling:

    * ``one_shot_all_reduce(tensor, reduce_op="sum", group=None)`` -> a new tensor, the reduction
      of every member's buffer;
    * ``two_shot_all_reduce_(tensor, ...)``, ``multimem_all_reduce_(tensor, ...)`` -> ``tensor``,
      which then holds the reduction (in place);
    * ``low_contention_all_gather(tensor, group=None)`` -> the members' buffers concatenated along
      dim 0 in rank order;
    * ``low_contention_reduce_scatter(tensor, reduce_op="sum", group=None)`` -> chunk ``rank`` (of
      ``group size`` chunks along dim 0) of the reduction;
    * ``fused_all_gather_matmul(A, Bs, gather_dim=0, return_A=True, group=None)`` -> ``(A gathered
      along gather_dim or None, [A gathered @ B for B in Bs])``;
    * ``get_remote_tensors(tensor, group=None)`` -> every member's buffer, in rank order;
    * ``unsupported(op, hdl=None)`` -> why ``op`` (a name in ``OPERATIONS``) cannot run here, or None
      when it can (``hdl``: a rendezvoused handle, for what depends on the buffers, as multicast).
    """

    name: str

    def allocate(self, shape: Sequence[int], dtype: Any) -> Any: ...

    def rendezvous(self, tensor: Any) -> Any: ...

    def put_signal(self, src: Any, hdl: Any, peer: int) -> None: ...

    def wait_signal(self, hdl: Any, peer: int) -> None: ...

    def barrier(self) -> None: ...

    def one_shot_all_reduce(self, tensor: Any, reduce_op: str = "sum", group: Any = None) -> Any: ...

    def two_shot_all_reduce_(self, tensor: Any, reduce_op: str = "sum", group: Any = None) -> Any: ...

    def multimem_all_reduce_(self, tensor: Any, reduce_op: str = "sum", group: Any = None) -> Any: ...

    def low_contention_all_gather(self, tensor: Any, group: Any = None) -> Any: ...

    def low_contention_reduce_scatter(self, tensor: Any, reduce_op: str = "sum", group: Any = None) -> Any: ...

    def fused_all_gather_matmul(self, A: Any, Bs: Sequence[Any], gather_dim: int = 0, return_A: bool = True,
                                group: Any = None) -> tuple[Any, list]: ...

    def get_remote_tensors(self, tensor: Any, group: Any = None) -> list: ...

    def unsupported(self, op: str, hdl: Any = None) -> str | None: ...


class TorchSymmetricMemory:
    """``torch.distributed._symmetric_memory`` on the rank's device and default group.

    ``put_signal``/``wait_signal`` dispatch on the allocation backend (in torch 2.13 only NCCL's
    implements them), and torch refuses to change that backend after the first allocation of the
    process. So the backend is not chosen here: every rank selects the descriptor's
    ``symmetric_memory_backend`` when it starts, before any test can allocate (see
    ``conformance.ranks.worker``). This class only reports a selection that failed, in torch's words.
    """

    name = "torch"

    def __init__(self, ctx):
        import torch.distributed._symmetric_memory as symm_mem

        self.ctx = ctx
        self.symm_mem = symm_mem
        self.device = ctx.device
        if ctx.symmetric_memory_backend_error:
            raise RuntimeError(
                f"symmetric memory on {self.device}: the {ctx.symmetric_memory_backend} allocation backend that "
                f"{ctx.descriptor}'s descriptor names (symmetric_memory_backend) could not be selected when the "
                f"rank started: {ctx.symmetric_memory_backend_error}")

    def allocate(self, shape, dtype):
        return self.symm_mem.empty(*shape, dtype=dtype, device=self.device)

    def rendezvous(self, tensor, group=None):
        return self.symm_mem.rendezvous(tensor, group=self._group(group))

    def put_signal(self, src, hdl, peer):
        self.symm_mem.put_signal(src, hdl, peer)

    def wait_signal(self, hdl, peer):
        self.symm_mem.wait_signal(hdl, peer)

    def barrier(self):
        import torch.distributed as dist

        dist.barrier(group=self.ctx.group)

    # -- the collectives: torch.ops.symm_mem with the group's name (torch 2.13 and 2.15 alike) --------

    def _group(self, group):
        return self.ctx.group if group is None else group

    def _ops(self):
        import torch

        return torch.ops.symm_mem

    def one_shot_all_reduce(self, tensor, reduce_op="sum", group=None):
        return self._ops().one_shot_all_reduce(tensor, reduce_op, self._group(group).group_name)

    def two_shot_all_reduce_(self, tensor, reduce_op="sum", group=None):
        return self._ops().two_shot_all_reduce_(tensor, reduce_op, self._group(group).group_name)

    def multimem_all_reduce_(self, tensor, reduce_op="sum", group=None):
        return self._ops().multimem_all_reduce_(tensor, reduce_op, self._group(group).group_name)

    def low_contention_all_gather(self, tensor, group=None):
        return self._ops()._low_contention_all_gather(tensor, self._group(group).group_name)

    def low_contention_reduce_scatter(self, tensor, reduce_op="sum", group=None):
        return self._ops()._low_contention_reduce_scatter(tensor, reduce_op, self._group(group).group_name)

    def fused_all_gather_matmul(self, A, Bs, gather_dim=0, return_A=True, group=None):
        A_out, outs = self._ops().fused_all_gather_matmul(A, list(Bs), gather_dim, self._group(group).group_name,
                                                          return_A=return_A)
        return A_out, list(outs)

    def get_remote_tensors(self, tensor, group=None):
        return list(self._ops().get_remote_tensors(tensor, self._group(group).group_name))

    def unsupported(self, op, hdl=None):
        """A kernel of ``symm_mem::<op>`` for this device's dispatch key (torch 2.15 adds XPU kernels for
        some ops, 2.13 has CUDA's only; which ops a build has is read here, not assumed from the version),
        and for ``multimem_all_reduce_`` a multicast address on the handle (NVLS: NVSwitch systems only)."""
        import torch

        kind = torch.device(self.device).type
        key = ("PrivateUse1" if kind == torch._C._get_privateuse1_backend_name() else
               {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS"}.get(kind, kind.upper()))
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"symm_mem::{op}", key):
            return f"torch {torch.__version__} has no {key} kernel for symm_mem::{op}"
        if op == "multimem_all_reduce_" and hdl is not None and not getattr(hdl, "multicast_ptr", 0):
            return (f"multimem_all_reduce_ needs multicast: the symmetric buffer's handle on {self.device} has no "
                    "multicast address (multicast_ptr is 0; NVLS needs NVSwitch)")
        return None


def resolve(impl: str):
    """resolve(impl) -> the implementation class: ``"torch"`` or ``"package.module:ATTRIBUTE"``."""
    if impl == "torch":
        return TorchSymmetricMemory
    module, sep, attr = impl.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"symmetric memory implementation {impl!r}: expected 'torch' or "
                         "'package.module:ATTRIBUTE' naming a class with the methods of SymmetricMemory")
    obj = getattr(importlib.import_module(module), attr)
    missing = [m for m in METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"symmetric memory implementation {impl!r} lacks {', '.join(missing)}")
    return obj
