"""Device meshes for the DTensor suites, and many cases per ``ranks.run`` with the ranks agreeing on
each case's outcome before the next one starts.

A DTensor case that raises on one rank only (a handler bug, a shape one rank cannot handle) leaves
its peers waiting in a collective. Without care the raising rank moves on to the next case, whose
collectives pair with the ones its peers still wait in, and the whole matrix hangs or mixes cases up.
So: the mesh's groups have a short timeout (a peer left waiting gets an error, not a hang); after
every case the ranks exchange their outcomes over a separate control group; when they disagree,
that case records it and the next one runs on a freshly built mesh.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import traceback
from typing import Any, Callable, Iterable

CASE_TIMEOUT = 15.0  # seconds a rank waits in one case's collective for a peer that raised

_STATE: dict[str, Any] = {}


def _groups(ctx, shape: tuple[int, ...]):
    """One fresh process group per mesh dim for this rank (every rank creates every group)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=CASE_TIMEOUT)
    if len(shape) == 1:
        return [dist.new_group(timeout=timeout)]
    rows, cols = shape
    for r in range(rows):  # groups along mesh dim 1: one per row
        group = dist.new_group(list(range(r * cols, (r + 1) * cols)), timeout=timeout)
        if ctx.rank // cols == r:
            row_group = group
    for c in range(cols):  # groups along mesh dim 0: one per column
        group = dist.new_group(list(range(c, rows * cols, cols)), timeout=timeout)
        if ctx.rank % cols == c:
            col_group = group
    return [col_group, row_group]


def _build(ctx, shape: tuple[int, ...]):
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    if len(shape) == 2 and shape[0] * shape[1] != ctx.world_size:
        raise ValueError(f"a {shape[0]} x {shape[1]} mesh needs {shape[0] * shape[1]} ranks, this pool has "
                         f"{ctx.world_size}")
    groups = _groups(ctx, shape)
    # DTensor caches sharding decisions by mesh equality, and cached specs keep the mesh they were made
    # on: names unique to each build keep a rebuilt mesh from reaching the old (broken) groups.
    _STATE["builds"] = build = _STATE.get("builds", 0) + 1
    if len(shape) == 1:
        return DeviceMesh.from_group(groups[0], ctx.device.type, mesh_dim_names=(f"world{build}",))
    layout = torch.arange(ctx.world_size, device="cpu").view(*shape)  # a mesh's rank layout lives on the host
    return DeviceMesh.from_group(groups, ctx.device.type, mesh=layout, mesh_dim_names=(f"dp{build}", f"tp{build}"))


def device_mesh(ctx, shape: tuple[int, ...], *, fresh: bool = False):
    """The cached mesh of ``shape`` on this pool's current process group (rebuilt when ``fresh``)."""
    key = (id(ctx.group), tuple(shape))
    if _STATE.get("group") != id(ctx.group):  # a replaced process group invalidates everything built on it
        builds = _STATE.get("builds", 0)
        _STATE.clear()
        _STATE.update(group=id(ctx.group), builds=builds)
    if fresh or key not in _STATE:
        _STATE[key] = _build(ctx, tuple(shape))
    return _STATE[key]


def _control_group():
    import torch.distributed as dist

    if "control" not in _STATE:
        _STATE["control"] = dist.new_group(backend="gloo")
    return _STATE["control"]


def error_record(exc: BaseException) -> dict:
    text = str(exc).strip()
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}",
            "where": [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"
                      for f in traceback.extract_tb(exc.__traceback__)[-2:]]}


def run_cases(ctx, shape: tuple[int, ...], cases: Iterable[tuple[str, Callable]]) -> dict[str, dict]:
    """Run each ``(key, fn)``: ``fn(mesh) -> record`` (a dict), or the error it raised as a record.

    After each case the ranks agree on the outcome; a case whose outcome differs across ranks (some
    raised, or they raised differently) gets ``"peers"`` (each rank's outcome) in its record, and the
    next case runs on a new mesh.
    """
    records: dict[str, dict] = {}
    mesh = device_mesh(ctx, shape)
    control = _control_group()
    for key, fn in cases:
        try:
            record = fn(mesh)
        except Exception as exc:  # a crash is this case's result, not the matrix's
            record = error_record(exc)
        outcomes = _agree(ctx, control, record.get("error", "ok"))
        if len(set(outcomes)) > 1:  # some raised, or raised differently: the mesh's groups may be mid-collective
            record["peers"] = outcomes
            mesh = device_mesh(ctx, shape, fresh=True)
        records[key] = record
    return records


def _agree(ctx, control, outcome: str) -> list[str]:
    """Every rank's outcome of a case, over the control group. The ranks almost always agree: one
    all_gather of an 8-byte digest each says so; only when the digests differ do the ranks exchange
    the outcomes themselves (all_gather_object: two collectives and pickling, on every case of a
    matrix of thousands)."""
    import torch
    import torch.distributed as dist

    digest = int.from_bytes(hashlib.blake2b(outcome.encode(), digest_size=8).digest(), "little", signed=True)
    # On the host: the control group is gloo's whatever the backend.
    digests = [torch.empty(1, dtype=torch.int64, device="cpu") for _ in range(ctx.world_size)]
    dist.all_gather(digests, torch.tensor([digest], dtype=torch.int64, device="cpu"), group=control)
    if all(int(d) == digest for d in digests):
        return [outcome] * ctx.world_size
    outcomes: list = [None] * ctx.world_size
    dist.all_gather_object(outcomes, outcome, group=control)
    return outcomes


def disagreement(record: dict) -> str | None:
    """A sentence naming the ranks that raised when their peers did not, or None."""
    peers = record.get("peers")
    if not peers:
        return None
    raised = [f"rank {r} raised {o}" for r, o in enumerate(peers) if o != "ok"]
    fine = [str(r) for r, o in enumerate(peers) if o == "ok"]
    return "; ".join(raised) + (f"; rank {', '.join(fine)} completed" if fine else "")


def resolve_injected(name: str, default: Callable, what: str) -> Callable:
    """The implementation a DTensor check runs: ``default`` for ``"dtensor"``, else the function at
    ``"package.module:ATTRIBUTE"`` (the project's tests hand in broken ones to show they are caught)."""
    if name == "dtensor":
        return default
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {name!r}: expected 'dtensor' or 'package.module:ATTRIBUTE'")
    return getattr(importlib.import_module(module), attr)
