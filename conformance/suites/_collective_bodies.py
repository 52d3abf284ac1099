"""Rank functions of the collectives suites: each runs one collective (every root, where it has one)
on every rank and returns what it received, for the controller to compare with ``_collective_data``.

Every function takes ``impl``: the collective API it calls, resolved by
``_collective_impls.resolve_dist`` (``"torch"``: ``torch.distributed`` itself; otherwise an import
path to a stand-in the project's tests use to prove the suite catches broken collectives). Every
tensor is created on ``ctx.device``; results come back to the controller on CPU.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from conformance.suites._collective_data import PREMUL_FACTOR, packed, payload, reduce_input, unwritten, unwritten_like
from conformance.suites._collective_impls import resolve_dist, resolve_stand_in


def reduce_op(dist, op: str):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def destroy_once_connected(dist, group) -> None:
    """Destroy a group this call made, after a barrier on it. Over gloo, ``new_group`` can return on one
    rank while a peer is still connecting to it; a rank that then destroys the group at once (every call on
    it refused before it sent anything) closes the connection under that peer, whose ``new_group`` fails
    with "Connection closed by peer". The barrier (torch's own, whatever ``dist`` stands in for) waits
    until every member has it."""
    import torch.distributed

    torch.distributed.barrier(group=group)
    dist.destroy_process_group(group)


# -- reductions -------------------------------------------------------------------------------------

@packed
def all_reduce_on_rank(ctx, salt: str, op: str, dtype: str, numel: int, impl: str = "torch"):
    dist = resolve_dist(impl)
    tensor = reduce_input(salt, ctx.rank, numel, dtype, op).to(ctx.device)
    dist.all_reduce(tensor, op=reduce_op(dist, op))
    return tensor


@packed
def reduce_on_rank(ctx, salt: str, op: str, dtype: str, numel: int, impl: str = "torch"):
    """reduce to every dst in turn: ``[result on dst 0, ...]`` from dst, None from the others."""
    dist = resolve_dist(impl)
    out = []
    for dst in range(ctx.world_size):
        tensor = reduce_input(salt, ctx.rank, numel, dtype, op).to(ctx.device)
        dist.reduce(tensor, dst=dst, op=reduce_op(dist, op))
        out.append(tensor if ctx.rank == dst else None)
    return out


@packed
def rejected_reduction_on_rank(ctx, op: str, dtype: str, impl: str = "torch"):
    """None when all_reduce(op) on ``dtype`` returned (it must not), else the error."""
    dist = resolve_dist(impl)
    tensor = payload("rejected", ctx.rank, 8, dtype).to(ctx.device)
    try:
        dist.all_reduce(tensor, op=reduce_op(dist, op))
    except (RuntimeError, ValueError, TypeError) as exc:
        return _error(exc)
    return None


@packed
def reduce_scatter_on_rank(ctx, salt: str, op: str, dtype: str, chunk: int, impl: str = "torch"):
    """The tensor form and the list form: (tensor result, list result)."""
    dist = resolve_dist(impl)
    world = ctx.world_size
    full = reduce_input(salt, ctx.rank, chunk * world, dtype, op).to(ctx.device)
    single = unwritten(chunk, full.dtype, ctx.device)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(single, full.clone(), op=reduce_op(dist, op))
    listed = unwritten(chunk, full.dtype, ctx.device)
    dist.reduce_scatter(listed, list(full.clone().split(chunk)), op=reduce_op(dist, op))
    return single, listed


def uneven_sizes(world: int) -> list[int]:
    """Chunk sizes for the uneven (``_v``) forms: rank r gets ``r + 1`` elements, the last none."""
    return [r + 1 for r in range(world - 1)] + [0]


@packed
def reduce_scatter_uneven_on_rank(ctx, salt: str, op: str, dtype: str, impl: str = "torch"):
    dist = resolve_dist(impl)
    sizes = uneven_sizes(ctx.world_size)
    full = reduce_input(salt, ctx.rank, sum(sizes), dtype, op).to(ctx.device)
    out = unwritten(sizes[ctx.rank], full.dtype, ctx.device)
    dist.reduce_scatter(out, list(full.split(sizes)), op=reduce_op(dist, op))
    return out


# -- data movement ----------------------------------------------------------------------------------

@packed
def broadcast_on_rank(ctx, salt: str, dtype: str, numel: int, impl: str = "torch"):
    """broadcast from every src in turn: ``[what this rank holds after src 0's broadcast, ...]``."""
    dist = resolve_dist(impl)
    out = []
    for src in range(ctx.world_size):
        tensor = payload(f"{salt}/{src}", ctx.rank, numel, dtype).to(ctx.device)
        dist.broadcast(tensor, src=src)
        out.append(tensor)
    return out


@packed
def all_gather_on_rank(ctx, salt: str, dtype: str, numel: int, impl: str = "torch"):
    """(tensor form, list form concatenated)."""
    import torch

    dist = resolve_dist(impl)
    local = payload(salt, ctx.rank, numel, dtype).to(ctx.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    single = unwritten(numel * ctx.world_size, local.dtype, ctx.device)
    gather(single, local)
    listed = [unwritten_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(listed, local)
    return single, torch.cat(listed)


@packed
def gather_on_rank(ctx, salt: str, dtype: str, numel: int, impl: str = "torch"):
    """gather to every dst in turn: ``[list gathered on dst 0 (None elsewhere), ...]``."""
    dist = resolve_dist(impl)
    local = payload(salt, ctx.rank, numel, dtype).to(ctx.device)
    out = []
    for dst in range(ctx.world_size):
        listed = [unwritten_like(local) for _ in range(ctx.world_size)] if ctx.rank == dst else None
        dist.gather(local, listed, dst=dst)
        out.append(listed)
    return out


@packed
def scatter_on_rank(ctx, salt: str, dtype: str, numel: int, impl: str = "torch"):
    """scatter from every src in turn: src sends chunk r (``payload(salt/src, r)``) to rank r."""
    import torch

    dist = resolve_dist(impl)
    out = []
    for src in range(ctx.world_size):
        chunks = ([payload(f"{salt}/{src}", r, numel, dtype).to(ctx.device) for r in range(ctx.world_size)]
                  if ctx.rank == src else None)
        received = unwritten(numel, getattr(torch, dtype), ctx.device)
        dist.scatter(received, chunks, src=src)
        out.append(received)
    return out


def a2a_block(salt: str, src: int, dst: int, count: int, dtype: str):
    """What rank ``src`` sends rank ``dst`` in an all_to_all."""
    return payload(f"{salt}/{dst}", src, count, dtype)


def a2a_sizes(kind: str, src: int, dst: int, world: int) -> int:
    """Elements ``src`` sends ``dst``: ``even`` 3; ``uneven`` src + dst + 1; ``zero`` like uneven but
    nothing to the last rank and nothing from a rank to itself."""
    if kind == "even":
        return 3
    if kind == "zero" and (src == dst or dst == world - 1):
        return 0
    return src + dst + 1


@packed
def all_to_all_single_on_rank(ctx, salt: str, dtype: str, kind: str, impl: str = "torch"):
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    send_sizes = [a2a_sizes(kind, rank, dst, world) for dst in range(world)]
    recv_sizes = [a2a_sizes(kind, src, rank, world) for src in range(world)]
    send = torch.cat([a2a_block(salt, rank, dst, n, dtype) for dst, n in enumerate(send_sizes)]).to(ctx.device)
    recv = unwritten(sum(recv_sizes), send.dtype, ctx.device)
    if kind == "even":
        dist.all_to_all_single(recv, send)
    else:
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
    return recv


@packed
def all_to_all_list_on_rank(ctx, salt: str, dtype: str, kind: str, impl: str = "torch"):
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    send = [a2a_block(salt, rank, dst, a2a_sizes(kind, rank, dst, world), dtype).to(ctx.device)
            for dst in range(world)]
    recv = [unwritten(a2a_sizes(kind, src, rank, world), send[0].dtype, ctx.device)
            for src in range(world)]
    dist.all_to_all(recv, send)
    return torch.cat(recv)


# -- coalesced forms --------------------------------------------------------------------------------

@packed
def coalesced_on_rank(ctx, salt: str, dtype: str, impl: str = "torch"):
    """all_reduce_coalesced and a coalescing manager around all_reduce, all_gather_into_tensor and
    reduce_scatter_tensor, on tensors of different sizes: ``{form: [results]}``."""
    dist = resolve_dist(impl)
    world, sizes = ctx.world_size, (3, 5)
    out: dict[str, Any] = {}
    tensors = [reduce_input(f"{salt}/{i}", ctx.rank, n, dtype, "SUM").to(ctx.device) for i, n in enumerate(sizes)]
    dist.all_reduce_coalesced(tensors)
    out["all_reduce_coalesced"] = tensors
    tensors = [reduce_input(f"{salt}/{i}", ctx.rank, n, dtype, "SUM").to(ctx.device) for i, n in enumerate(sizes)]
    with dist._coalescing_manager():
        for t in tensors:
            dist.all_reduce(t)
    out["coalesced all_reduce"] = tensors
    locals_ = [payload(f"{salt}/{i}", ctx.rank, n, dtype).to(ctx.device) for i, n in enumerate(sizes)]
    gathered = [unwritten(n * world, locals_[0].dtype, ctx.device) for n in sizes]
    with dist._coalescing_manager():
        for o, i in zip(gathered, locals_):
            dist.all_gather_into_tensor(o, i)
    out["coalesced all_gather_into_tensor"] = gathered
    fulls = [reduce_input(f"{salt}/rs{i}", ctx.rank, n * world, dtype, "SUM").to(ctx.device)
             for i, n in enumerate(sizes)]
    scattered = [unwritten(n, fulls[0].dtype, ctx.device) for n in sizes]
    with dist._coalescing_manager():
        for o, i in zip(scattered, fulls):
            dist.reduce_scatter_tensor(o, i)
    out["coalesced reduce_scatter_tensor"] = scattered
    return out


# -- async handles ----------------------------------------------------------------------------------

ASYNC_COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather",
                     "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                     "barrier")


def _async_call(dist, ctx, name: str, salt: str):
    """Start ``name`` with async_op=True: (work, the tensors it fills on this rank)."""
    import torch

    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    mine = reduce_input(salt, rank, 4, "float32", "SUM").to(device)
    if name == "all_reduce":
        return dist.all_reduce(mine, async_op=True), [mine]
    if name == "broadcast":
        return dist.broadcast(mine, src=world - 1, async_op=True), [mine]
    if name == "reduce":
        return dist.reduce(mine, dst=world - 1, async_op=True), [mine] if rank == world - 1 else []
    if name == "all_gather":
        out = [unwritten_like(mine) for _ in range(world)]
        return dist.all_gather(out, mine, async_op=True), out
    if name == "all_gather_into_tensor":
        out = unwritten(4 * world, torch.float32, device)
        return dist.all_gather_into_tensor(out, mine, async_op=True), [out]
    if name == "gather":
        out = [unwritten_like(mine) for _ in range(world)] if rank == world - 1 else None
        return dist.gather(mine, out, dst=world - 1, async_op=True), out or []
    if name == "scatter":
        chunks = [reduce_input(salt, r, 4, "float32", "SUM").to(device) for r in range(world)] \
            if rank == world - 1 else None
        out = unwritten(4, torch.float32, device)
        return dist.scatter(out, chunks, src=world - 1, async_op=True), [out]
    if name in ("reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"):
        full = reduce_input(salt, rank, 4 * world, "float32", "SUM").to(device)
        out = unwritten(4 if name.startswith("reduce") else 4 * world, torch.float32, device)
        if name == "reduce_scatter":
            return dist.reduce_scatter(out, list(full.split(4)), async_op=True), [out]
        if name == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(out, full, async_op=True), [out]
        if name == "all_to_all":
            outs = list(out.split(4))
            return dist.all_to_all(outs, list(full.split(4)), async_op=True), [out]
        return dist.all_to_all_single(out, full, async_op=True), [out]
    return dist.barrier(async_op=True), []


@packed
def async_on_rank(ctx, salt: str, name: str, impl: str = "torch"):
    """``{"work": type name or None, "after_wait": [tensors read right after wait()], "completed":
    is_completed() after wait, "future": the future's value or its error}``."""
    dist = resolve_dist(impl)
    work, filled = _async_call(dist, ctx, name, salt)
    record: dict[str, Any] = {"work": None if work is None else type(work).__name__}
    if work is None:
        return record
    record["wait"] = work.wait()
    record["after_wait"] = [t.clone() for t in filled]  # read at once: a wait that did not wait shows here
    record["completed"] = work.is_completed()
    if not record["completed"] and ctx.device.type != "cpu":
        # A stream-ordered wait() (NCCL) leaves the host ahead of the device: once the device has
        # caught up, the work must say it is complete.
        import torch

        torch.accelerator.synchronize(ctx.device.index)
        record["completed_after_sync"] = work.is_completed()
    try:
        value = work.get_future().wait()
        record["future"] = [t.clone() for t in value] if isinstance(value, (list, tuple)) else value
    except RuntimeError as exc:
        record["future_error"] = _error(exc)
    return record


# -- object collectives -----------------------------------------------------------------------------

def rank_object(salt: str, rank: int) -> dict:
    """A picklable object of a different size on every rank."""
    return {"rank": rank, "salt": salt, "text": f"rank-{rank}-" + "x" * (7 * rank + 3),
            "nested": [rank, (rank, str(rank)), {"b": bytes(range(rank % 256)) * 3}], "none": None}


@packed
def object_collectives_on_rank(ctx, salt: str, impl: str = "torch"):
    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    out: dict[str, Any] = {}
    gathered = [None] * world
    dist.all_gather_object(gathered, rank_object(salt, rank))
    out["all_gather_object"] = gathered
    out["gather_object"], out["broadcast_object_list"], out["scatter_object_list"] = [], [], []
    for root in range(world):
        listed = [None] * world if rank == root else None
        dist.gather_object(rank_object(f"{salt}/g{root}", rank), listed, dst=root)
        out["gather_object"].append(listed)
        objects = [rank_object(f"{salt}/b{root}/{i}", root) for i in range(3)] if rank == root else [None] * 3
        dist.broadcast_object_list(objects, src=root)
        out["broadcast_object_list"].append(objects)
        received = [None]
        scattered = [rank_object(f"{salt}/s{root}", r) for r in range(world)] if rank == root else None
        dist.scatter_object_list(received, scattered, src=root)
        out["scatter_object_list"].append(received[0])
    return out


# -- point to point ---------------------------------------------------------------------------------

@packed
def send_recv_pairs_on_rank(ctx, salt: str, dtype: str, numel: int, pairs: list, impl: str = "torch"):
    """For each ordered (src, dst) pair in turn: src sends, dst receives. ``{"src->dst": tensor}``."""
    import torch

    dist = resolve_dist(impl)
    got = {}
    for src, dst in pairs:
        if ctx.rank == src:
            dist.send(payload(f"{salt}/{src}->{dst}", src, numel, dtype).to(ctx.device), dst=dst)
        elif ctx.rank == dst:
            buf = unwritten(numel, getattr(torch, dtype), ctx.device)
            dist.recv(buf, src=src)
            got[f"{src}->{dst}"] = buf
    return got


@packed
def isend_irecv_tags_on_rank(ctx, salt: str, count: int, impl: str = "torch"):
    """Every rank sends ``count`` tagged messages to the next rank and receives as many from the
    previous one, posting its receives in reverse tag order: each must land by tag, not by order."""
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    sends = [dist.isend(payload(f"{salt}/{tag}", rank, 5 + tag, "int64").to(ctx.device), dst=nxt, tag=tag)
             for tag in range(count)]
    bufs = {tag: unwritten(5 + tag, torch.int64, ctx.device) for tag in reversed(range(count))}
    recvs = [dist.irecv(buf, src=prev, tag=tag) for tag, buf in bufs.items()]
    for work in recvs + sends:
        work.wait()
    return [bufs[tag] for tag in range(count)]


@packed
def batch_isend_irecv_on_rank(ctx, salt: str, dtype: str, impl: str = "torch"):
    """One batch per rank: send to both neighbours, receive from both. (from prev, from next)."""
    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    to_next = payload(f"{salt}/fwd", rank, 6, dtype).to(ctx.device)
    to_prev = payload(f"{salt}/bwd", rank, 9, dtype).to(ctx.device)
    from_prev = unwritten(6, to_next.dtype, ctx.device)
    from_next = unwritten(9, to_next.dtype, ctx.device)
    ops = [dist.P2POp(dist.isend, to_next, nxt, tag=1), dist.P2POp(dist.isend, to_prev, prev, tag=2),
           dist.P2POp(dist.irecv, from_prev, prev, tag=1), dist.P2POp(dist.irecv, from_next, nxt, tag=2)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return from_prev, from_next


# -- groups and failures ----------------------------------------------------------------------------

@packed
def subgroups_on_rank(ctx, salt: str, kind: str, impl: str = "torch"):
    """Make subgroups with ``kind`` (new_group of every rank but the first, new_subgroups of half the
    world, split_group into even and odd ranks), then a SUM all_reduce and an all_gather on this
    rank's subgroup only. ``(members, all_reduce result, all_gather result)``, None for a rank in no
    subgroup, or the error it raised."""
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    try:
        if kind == "new_group":
            members = list(range(1, world)) or [0]
            group = dist.new_group(members)  # every rank must call it; only members use it
        elif kind == "new_subgroups":
            size = world // 2 if world % 2 == 0 else world
            group, _ = dist.new_subgroups(group_size=size)
            members = [r for r in range(world) if r // size == rank // size]
        else:
            members = [r for r in range(world) if r % 2 == rank % 2]
            group = dist.split_group(split_ranks=[[r for r in range(world) if r % 2 == p] for p in (0, 1)
                                                  if p < world])
    except RuntimeError as exc:
        return _error(exc)
    if rank not in members:
        return None
    reduced = reduce_input(f"{salt}/{kind}", rank, 5, "int64", "SUM").to(ctx.device)
    dist.all_reduce(reduced, group=group)
    mine = payload(f"{salt}/{kind}", rank, 4, "int64").to(ctx.device)
    gathered = [unwritten_like(mine) for _ in members]
    dist.all_gather(gathered, mine, group=group)
    return members, reduced, torch.cat(gathered)


def _timed_group(dist, seconds: float):
    return dist.new_group(timeout=datetime.timedelta(seconds=seconds))


@packed
def missing_rank_on_rank(ctx, how: str, seconds: float, impl: str = "torch"):
    """The last rank skips (``skip``), raises before (``raise``) an all_reduce on a group with a
    ``seconds`` timeout, or skips a monitored_barrier (``monitored_barrier``). Every other rank
    records the error it gets; then all ranks all_reduce on a fresh group.
    ``{"error": str or None, "fresh": tensor}``."""
    import torch

    dist = resolve_dist(impl)
    world, rank = ctx.world_size, ctx.rank
    group = _timed_group(dist, seconds)
    record: dict[str, Any] = {"error": None}
    absent = rank == world - 1
    try:
        if how == "raise" and absent:
            raise RuntimeError("deliberate failure on the last rank before the collective")
        if not absent:
            if how == "monitored_barrier":
                dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=seconds))
            else:
                dist.all_reduce(torch.ones(3, device=ctx.device), group=group)
    except (RuntimeError, ValueError) as exc:  # monitored_barrier refuses a backend other than gloo with ValueError
        record["error"] = _error(exc)
    fresh = _timed_group(dist, 60)
    record["fresh"] = torch.full((3,), rank + 1, device=ctx.device)
    dist.all_reduce(record["fresh"], group=fresh)
    return record


def _end_group(dist, group, how: str) -> None:
    """End ``group`` the way ``how`` names: ``abort`` / ``shutdown`` (the group's own methods) or
    ``destroy`` (``destroy_process_group``)."""
    if how == "destroy":
        dist.destroy_process_group(group)
    else:
        getattr(group, how)()


# A group ended with work pending, and that work, stay referenced for the rank's life: their destructors
# may wait for the work (up to the group's own timeout) and must not do so inside a later call.
_ENDED_WITH_WORK_PENDING: list = []


def pending_work_on_rank(ctx, how: str, wait_seconds: float | None, group_seconds: float, impl: str = "torch",
                         ender: str = "torch"):
    """Every rank but the last starts an all_reduce on a group (``group_seconds`` timeout) that the last never
    joins; with ``wait_seconds``, waits for it with that timeout; then ends the group (``how``: abort,
    shutdown, destroy) with the work still pending. Then all ranks all_reduce on a fresh group, and the last
    destroys its side of the first. ``{"wait": "returned" | error, "wait_seconds", "end": None | error,
    "end_seconds", "completed_after_end", "fresh": tensor}`` (the last rank: ``{"fresh": tensor}``)."""
    import torch

    dist = resolve_dist(impl)
    end = resolve_stand_in(ender, _end_group)
    world, rank = ctx.world_size, ctx.rank
    group = _timed_group(dist, group_seconds)
    dist.all_reduce(torch.ones(1, device=ctx.device), group=group)  # connected before the work that stays pending
    record: dict[str, Any] = {}
    if rank != world - 1:
        work = dist.all_reduce(torch.ones(3, device=ctx.device), group=group, async_op=True)
        _ENDED_WITH_WORK_PENDING.append((group, work))
        if wait_seconds is not None:
            started = time.monotonic()
            try:
                work.wait(timeout=datetime.timedelta(seconds=wait_seconds))
                record["wait"] = "returned"
            except RuntimeError as exc:  # DistBackendError is one
                record["wait"] = _error(exc)
            record["wait_seconds"] = time.monotonic() - started
        started = time.monotonic()
        try:
            end(dist, group, how)
            record["end"] = None
        except RuntimeError as exc:
            record["end"] = _error(exc)
        record["end_seconds"] = time.monotonic() - started
        time.sleep(0.2)  # a backend that fails the pending work does so from its own thread
        record["completed_after_end"] = work.is_completed()
    fresh = _timed_group(dist, 60)
    record["fresh"] = torch.full((3,), rank + 1, device=ctx.device)
    dist.all_reduce(record["fresh"], group=fresh)
    if rank == world - 1:
        _ENDED_WITH_WORK_PENDING.append((group, None))
        dist.destroy_process_group(group)
    elif how != "destroy":
        dist.destroy_process_group(group)
    return record


# -- the NaN check ------------------------------------------------------------------------------------

NAN_CHECK_CASES = ("clean", "receive_buffer", "input")


def _nan_checked_group(dist, env_var: str):
    """A group of every rank created with ``env_var``=1 (read when the group is made); the variable is
    put back as it was at once, so no later group of this rank checks."""
    import os

    before = os.environ.get(env_var)
    os.environ[env_var] = "1"
    try:
        return dist.new_group()
    finally:
        if before is None:
            os.environ.pop(env_var, None)
        else:
            os.environ[env_var] = before


def nan_check_on_rank(ctx, env_var: str, case: str, impl: str = "torch"):
    """On a group made with ``env_var``=1, as upstream's own NaN-check tests do:
    ``clean``: finite data through broadcast (from rank 0), all_reduce and all_gather_into_tensor
    -> (broadcast, reduced, gathered); ``receive_buffer``: a NaN in the buffer every rank but 0 receives
    a broadcast into, and in the buffer rank 1 receives rank 0's send into -> (broadcast, received or
    None); ``input``: a NaN in every rank's input of an all_gather_into_tensor -> the gathered tensor,
    which the call must not get to (on an accelerator the check's device-side assert shows at the sync).
    """
    import torch

    dist = resolve_dist(impl)
    group = _nan_checked_group(dist, env_var)
    rank, world, device = ctx.rank, ctx.world_size, ctx.device

    def synchronized(value):
        if device.type != "cpu":
            torch.accelerator.synchronize(device)
        return value

    if case == "clean":
        x = torch.full((10,), float(rank), device=device)
        reduced = torch.ones(3, 4, device=device)
        gathered = torch.empty(4 * world, device=device)
        dist.broadcast(x, src=0, group=group)
        dist.all_reduce(reduced, group=group)
        dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank), device=device), group=group)
        dist.barrier(group=group)
        result = synchronized((x, reduced, gathered))
    elif case == "receive_buffer":
        sent = torch.ones(3, 4, device=device)
        if rank != 0:
            sent[1, 1] = float("nan")  # overwritten by rank 0's data
        dist.broadcast(sent, src=0, group=group)
        received = None
        if rank == 0:
            dist.send(sent, 1, group=group)
        elif rank == 1:
            received = torch.full((3, 4), float("nan"), device=device)
            dist.recv(received, 0, group=group)
        result = synchronized((sent, received))
    elif case == "input":
        poisoned = torch.zeros(4, device=device)
        poisoned[rank % 4] = float("nan")
        gathered = torch.empty(4 * world, device=device)
        dist.all_gather_into_tensor(gathered, poisoned, group=group)  # raises (the group is left to the pool)
        result = synchronized(gathered)  # reached only where the NaN went unchecked
    else:
        raise ValueError(f"unknown NaN-check case {case!r}; expected one of {', '.join(NAN_CHECK_CASES)}")
    dist.destroy_process_group(group)
    return result


# -- sizes ------------------------------------------------------------------------------------------

@packed
def zero_size_on_rank(ctx, dtype: str, impl: str = "torch"):
    """Every collective on empty tensors: the shapes they leave behind."""
    import torch

    dist = resolve_dist(impl)
    world, dev, dt = ctx.world_size, ctx.device, getattr(torch, dtype)
    empty = torch.empty(0, dtype=dt, device=dev)
    dist.all_reduce(empty)
    dist.broadcast(empty, src=world - 1)
    dist.reduce(empty, dst=world - 1)
    listed = [torch.empty(0, dtype=dt, device=dev) for _ in range(world)]
    dist.all_gather(listed, empty)
    gathered = torch.empty(0, dtype=dt, device=dev)
    dist.all_gather_into_tensor(gathered, empty)
    scattered = torch.empty(0, dtype=dt, device=dev)
    dist.reduce_scatter_tensor(scattered, torch.empty(0, dtype=dt, device=dev))
    a2a = torch.empty(0, dtype=dt, device=dev)
    dist.all_to_all_single(a2a, torch.empty(0, dtype=dt, device=dev))
    return [tuple(t.shape) for t in [empty, *listed, gathered, scattered, a2a]]


def large_numel(device_type: str) -> int:
    """Bounded on CPU (4 MiB of float32 + 3 elements); >= 64 MiB + 1 element on accelerators."""
    return 2 ** 20 + 3 if device_type == "cpu" else 2 ** 24 + 1


@packed
def large_on_rank(ctx, salt: str, impl: str = "torch"):
    """all_reduce, broadcast, all_gather_into_tensor and all_to_all_single on a large float32 message,
    checked on the rank (the expected values are computed there too): ``{collective: problem or None}``."""
    import torch

    from conformance.suites._collective_data import expected_reduction, same_bits

    dist = resolve_dist(impl)
    world, rank, numel = ctx.world_size, ctx.rank, large_numel(ctx.device.type)
    out: dict[str, Any] = {"numel": numel}
    mine = reduce_input(salt, rank, numel, "float32", "SUM").to(ctx.device)
    dist.all_reduce(mine)
    want = expected_reduction("SUM", [reduce_input(salt, r, numel, "float32", "SUM") for r in range(world)])
    out["all_reduce"] = same_bits(mine.cpu(), want)
    mine = payload(salt, rank, numel, "float32").to(ctx.device)
    dist.broadcast(mine, src=world - 1)
    out["broadcast"] = same_bits(mine.cpu(), payload(salt, world - 1, numel, "float32"))
    local = payload(salt, rank, numel, "float32").to(ctx.device)
    gathered = unwritten(numel * world, torch.float32, ctx.device)
    dist.all_gather_into_tensor(gathered, local)
    out["all_gather_into_tensor"] = same_bits(gathered.cpu(), torch.cat([payload(salt, r, numel, "float32")
                                                                         for r in range(world)]))
    chunk = numel // world
    send = payload(f"{salt}/a2a", rank, chunk * world, "float32").to(ctx.device)
    recv = unwritten_like(send)
    dist.all_to_all_single(recv, send)
    want = torch.cat([payload(f"{salt}/a2a", r, chunk * world, "float32")[rank * chunk:(rank + 1) * chunk]
                      for r in range(world)])
    out["all_to_all_single"] = same_bits(recv.cpu(), want)
    return out
