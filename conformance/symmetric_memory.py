"""The symmetric-memory operations the ``symmetric_memory`` suite tests, behind one small interface.

Rank functions of ``conformance/suites/test_symmetric_memory.py`` take an ``impl`` name and reach
symmetric memory only through the ``SymmetricMemory`` object that ``resolve(impl)(ctx)`` builds on
the rank: ``allocate``, ``rendezvous``, ``put_signal``, ``wait_signal``, ``barrier``. ``"torch"``
(the default) is the real thing, ``torch.distributed._symmetric_memory`` over the backend's process
group. Any other name is an import path ``"package.module:ATTRIBUTE"`` naming a class with the same
methods, which the rank processes import themselves: the project's own tests use this to run the
very same test bodies against a CPU reference implementation and against deliberately broken ones.
Nothing here imports torch at module level.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence

__all__ = ["SymmetricMemory", "TorchSymmetricMemory", "resolve"]


class SymmetricMemory(Protocol):
    """What a symmetric-memory implementation offers one rank (built per rank from its RankContext).

    * ``allocate(shape, dtype)`` -> a tensor on this rank's device that may be rendezvoused;
    * ``rendezvous(tensor)`` -> a handle; collective over the rank's group; every rank passes a
      tensor of the same shape and dtype;
    * ``put_signal(src, hdl, peer)``: copy ``src`` into ``peer``'s buffer of ``hdl``, then signal
      ``peer``; each signal is consumed by exactly one ``wait_signal``;
    * ``wait_signal(hdl, peer)``: block until ``peer`` has signalled this rank on ``hdl``; the
      buffer then holds what ``peer`` put;
    * ``barrier()``: every rank of the group has arrived, and earlier puts are complete.
    """

    name: str

    def allocate(self, shape: Sequence[int], dtype: Any) -> Any: ...

    def rendezvous(self, tensor: Any) -> Any: ...

    def put_signal(self, src: Any, hdl: Any, peer: int) -> None: ...

    def wait_signal(self, hdl: Any, peer: int) -> None: ...

    def barrier(self) -> None: ...


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

    def rendezvous(self, tensor):
        return self.symm_mem.rendezvous(tensor, group=self.ctx.group)

    def put_signal(self, src, hdl, peer):
        self.symm_mem.put_signal(src, hdl, peer)

    def wait_signal(self, hdl, peer):
        self.symm_mem.wait_signal(hdl, peer)

    def barrier(self):
        import torch.distributed as dist

        dist.barrier(group=self.ctx.group)


def resolve(impl: str):
    """resolve(impl) -> the implementation class: ``"torch"`` or ``"package.module:ATTRIBUTE"``."""
    if impl == "torch":
        return TorchSymmetricMemory
    module, sep, attr = impl.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"symmetric memory implementation {impl!r}: expected 'torch' or "
                         "'package.module:ATTRIBUTE' naming a class with allocate, rendezvous, "
                         "put_signal, wait_signal and barrier")
    obj = getattr(importlib.import_module(module), attr)
    missing = [m for m in ("allocate", "rendezvous", "put_signal", "wait_signal", "barrier")
               if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"symmetric memory implementation {impl!r} lacks {', '.join(missing)}")
    return obj
