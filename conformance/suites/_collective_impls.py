"""The collectives the suites test, behind two seams: a name -> ``CollectiveSet`` (typed collectives)
and a name -> the ``torch.distributed`` API (``resolve_dist``, the plain collectives suites).

Rank functions of ``test_typed_collectives`` take an ``impl`` name and call every collective through
the set it resolves to, on the rank. ``"torch"`` (the default) is the real thing: spmd-types'
typed collectives over the backend's process group, and torch's functional collectives with
autograd. Any other name is an import path ``"package.module:ATTRIBUTE"`` to a ``CollectiveSet``,
so the project's own tests can hand the suite a deliberately broken collective and prove that the
suite notices (the rank processes import that module themselves; nothing is registered by side
effect).

``resolve_dist(name)`` does the same for the plain collectives suites (``collectives``, ``p2p``,
``collective_layouts``, ``process_groups``): ``"torch"`` is the ``torch.distributed`` module itself,
anything else an import path to an object with the same functions (a broken stand-in).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

__all__ = ["CollectiveSet", "resolve", "resolve_dist", "torch_collectives"]


@dataclass(frozen=True)
class CollectiveSet:
    """One implementation of each collective the suite uses.

    Typed (spmd-types signatures, ``fn(x, axis, *, src, dst, ...)``): ``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``all_to_all``. Raw functional collectives with autograd over a process
    group: ``raw_all_reduce(x, group)`` (sum), ``raw_all_gather(x, group)`` (concatenate on dim 0),
    ``raw_reduce_scatter(x, group)`` (sum, scatter dim 0), ``raw_all_to_all(x, output_splits,
    input_splits, group)`` (dim 0).
    """

    name: str
    all_reduce: Callable
    all_gather: Callable
    reduce_scatter: Callable
    all_to_all: Callable
    raw_all_reduce: Callable
    raw_all_gather: Callable
    raw_reduce_scatter: Callable
    raw_all_to_all: Callable


def _raw_all_reduce(x, group):
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_reduce(x, "sum", group))


def _raw_all_gather(x, group):
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_gather_tensor_autograd(x, 0, group))


def _raw_reduce_scatter(x, group):
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.reduce_scatter_tensor_autograd(x, "sum", 0, group))


def _raw_all_to_all(x, output_splits, input_splits, group):
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x, output_splits, input_splits, group))


def torch_collectives() -> CollectiveSet:
    """The real implementation: spmd-types' collectives and torch's functional collectives."""
    import spmd_types

    return CollectiveSet(
        name="torch",
        all_reduce=spmd_types.all_reduce, all_gather=spmd_types.all_gather,
        reduce_scatter=spmd_types.reduce_scatter, all_to_all=spmd_types.all_to_all,
        raw_all_reduce=_raw_all_reduce, raw_all_gather=_raw_all_gather,
        raw_reduce_scatter=_raw_reduce_scatter, raw_all_to_all=_raw_all_to_all,
    )


def _imported(name: str):
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"collective implementation {name!r}: expected 'torch' or 'package.module:ATTRIBUTE'")
    return getattr(importlib.import_module(module), attr)


def resolve(name: str) -> CollectiveSet:
    """resolve(name) -> CollectiveSet: ``"torch"`` or ``"package.module:ATTRIBUTE"``."""
    if name == "torch":
        return torch_collectives()
    value = _imported(name)
    value = value() if callable(value) and not isinstance(value, CollectiveSet) else value
    if not isinstance(value, CollectiveSet):
        raise TypeError(f"collective implementation {name!r} is a {type(value).__name__}, not a CollectiveSet")
    return value


def resolve_stand_in(name: str, default):
    """``default`` for ``"torch"``, else the function at ``"package.module:ATTRIBUTE"`` (a broken stand-in)."""
    return default if name == "torch" else _imported(name)


def resolve_dist(name: str):
    """resolve_dist(name) -> the distributed API: ``torch.distributed`` for ``"torch"``, else the object
    at ``"package.module:ATTRIBUTE"`` (it offers the same functions, some of them broken)."""
    if name == "torch":
        import torch.distributed

        return torch.distributed
    return _imported(name)
