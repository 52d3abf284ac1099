"""The bodies of the symmetric-memory suite: what each rank does, and what the controller checks.

Written once against ``conformance.symmetric_memory.SymmetricMemory`` (an ``impl`` name resolved on
each rank), so that ``test_symmetric_memory.py`` runs them on a backend's real symmetric memory and
the project's own tests run the very same bodies against a CPU reference implementation and against
deliberately broken ones. Each ``check_*`` function takes anything with ``run_with_timeout`` and
``world_size`` (the ``ranks`` fixture or a ``RankPool``), runs its rank function and raises
``ConformanceFailure`` naming the rank, the peer and what was seen.

Rank functions catch the errors they expect (and a wait that never returns is bounded by
``BODY_TIMEOUT``), so a failing body leaves the process group healthy. The collectives on symmetric
buffers (``check_symm_op``, ``check_fused_all_gather_matmul``, ``check_subgroup_rendezvous``) skip,
saying why, when the implementation's ``unsupported`` names a reason on any rank (every rank agrees
first, so either all call the collective or none does). Buffers start filled with
``SENTINEL``, a value no payload takes, so data that never arrived shows up as the sentinel.
"""

from __future__ import annotations

import time

from conformance.checks import ConformanceFailure, assert_close

SENTINEL = 101  # payload values are 0..96 (see payload), exact in every dtype the suite uses
BODY_TIMEOUT = 120.0
ROUNDS = 100
LATE_PUT_SECONDS = 0.2


def payload(sender: int, tag: int, numel: int, dtype, device=None):
    """What ``sender`` puts in exchange ``tag``: distinct per sender, tag and element, on ``device``
    (ranks pass their buffer's; the controller's checks use its default, cpu)."""
    import torch

    idx = torch.arange(numel, dtype=torch.int64, device=device)
    return ((idx * 7 + sender * 13 + tag * 5) % 97).to(dtype)


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _open(ctx, impl: str):
    from conformance.symmetric_memory import resolve

    return resolve(impl)(ctx)


def _buffers(mem, numel: int, dtype):
    """A rendezvoused source and destination, each a symmetric tensor, as upstream's test uses."""
    src = mem.allocate((numel,), dtype)
    dst = mem.allocate((numel,), dtype)
    dst.fill_(SENTINEL)
    mem.rendezvous(src)
    hdl = mem.rendezvous(dst)
    mem.barrier()
    return src, dst, hdl


def _raises(fn) -> str | None:
    """``"Type: message"`` of what ``fn()`` raised, or None: an error here is an observation, not a
    crash of the pool."""
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _wait(mem, hdl, peer: int) -> str | None:
    return _raises(lambda: mem.wait_signal(hdl, peer))


# -- functions that run on every rank -------------------------------------------------------------

def pairwise_on_rank(ctx, impl: str, direction: str, numel: int, dtype_name: str, late_put: float = 0.0):
    """One put_signal/wait_signal per pair: ``odd->even`` (rank 2k+1 puts to 2k, as upstream's
    test) or ``even->odd``; with ``late_put`` the sender sleeps that long first, so the receiver's
    wait is posted before the put. Returns the receiver's view after its wait and the sender's own
    destination buffer, which nobody writes to."""
    mem = _open(ctx, impl)
    dtype = _dtype(dtype_name)
    src, dst, hdl = _buffers(mem, numel, dtype)
    sender_parity = 1 if direction == "odd->even" else 0
    step = -1 if direction == "odd->even" else 1
    role, peer, error = "idle", None, None
    if ctx.rank % 2 == sender_parity:
        peer = ctx.rank + step
        if 0 <= peer < ctx.world_size:
            role = "sender"
            time.sleep(late_put)
            src.copy_(payload(ctx.rank, 0, numel, dtype, src.device))
            mem.put_signal(src, hdl, peer)
    else:
        peer = ctx.rank - step
        if 0 <= peer < ctx.world_size:
            role = "receiver"
            error = _wait(mem, hdl, peer)
    seen = dst.clone()
    mem.barrier()
    return {"role": role, "peer": peer, "error": error, "dst": seen}


def ring_on_rank(ctx, impl: str, numel: int):
    """For every shift k in 1..world-1: put to rank+k, wait for rank-k; so each rank signals every
    peer once. Returns what arrived from each source."""
    import torch

    mem = _open(ctx, impl)
    src, dst, hdl = _buffers(mem, numel, torch.float32)
    arrived, errors = {}, {}
    for shift in range(1, ctx.world_size):
        to, frm = (ctx.rank + shift) % ctx.world_size, (ctx.rank - shift) % ctx.world_size
        src.copy_(payload(ctx.rank, shift, numel, torch.float32, src.device))
        mem.put_signal(src, hdl, to)
        error = _wait(mem, hdl, frm)
        if error:
            errors[frm] = error
        arrived[frm] = dst.clone()
        mem.barrier()  # nobody overwrites a buffer before its owner has read it
    return {"arrived": arrived, "errors": errors}


def rounds_on_rank(ctx, impl: str, rounds: int, numel: int):
    """``rounds`` exchanges odd->even through one buffer and one signal. Every tenth put is late, so
    a wait that returns on an old signal reads the previous round's data."""
    import torch

    mem = _open(ctx, impl)
    src, dst, hdl = _buffers(mem, numel, torch.float32)
    sender = ctx.rank % 2 == 1
    peer = ctx.rank - 1 if sender else ctx.rank + 1
    active = 0 <= peer < ctx.world_size
    seen, errors = [], []
    for r in range(rounds):
        if active and sender:
            if r % 10 == 5:
                time.sleep(0.05)
            src.copy_(payload(ctx.rank, r, numel, torch.float32, src.device))
            mem.put_signal(src, hdl, peer)
        elif active and not errors:  # after a failed wait, only keep the barriers in step
            error = _wait(mem, hdl, peer)
            if error:
                errors.append((r, error))
            else:
                seen.append(dst.clone())
        mem.barrier()
    return {"role": ("sender" if sender else "receiver") if active else "idle", "peer": peer,
            "seen": seen, "errors": errors}


def errors_on_rank(ctx, impl: str):
    """The error cases, each caught here: a peer outside the group (put and wait, above and below)
    and rendezvous of a tensor that symmetric memory did not allocate."""
    import torch

    mem = _open(ctx, impl)
    src, dst, hdl = _buffers(mem, 16, torch.float32)
    world = ctx.world_size
    outcome = {
        f"put_signal(peer={world})": _raises(lambda: mem.put_signal(src, hdl, world)),
        "put_signal(peer=-1)": _raises(lambda: mem.put_signal(src, hdl, -1)),
        f"wait_signal(peer={world})": _raises(lambda: mem.wait_signal(hdl, world)),
    }
    mem.barrier()
    plain = torch.zeros(16, device=ctx.device)
    outcome["rendezvous(a tensor from torch.zeros)"] = _raises(lambda: mem.rendezvous(plain))
    mem.barrier()
    return outcome


# -- the collectives on symmetric buffers: functions that run on every rank ------------------------
# Inputs are float32 small integers (payload), so every sum, gather and product is exact in float32.

COLS = 8           # a buffer is [ROWS_PER_RANK * world, COLS]: rows split evenly in any group, 16-byte aligned
ROWS_PER_RANK = 4
MATMUL_COLS = (3, 5)  # fused_all_gather_matmul: two Bs, [COLS, 3] and [COLS, 5]
SYMM_OPS = ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_", "_low_contention_all_gather",
            "_low_contention_reduce_scatter", "get_remote_tensors")  # the ops symm_op_on_rank runs
OP_TAGS = {"one_shot_all_reduce": 1, "two_shot_all_reduce_": 2, "multimem_all_reduce_": 3,
           "_low_contention_all_gather": 4, "_low_contention_reduce_scatter": 5, "fused_all_gather_matmul": 6,
           "get_remote_tensors": 7, "rendezvous(sub-group)": 8}


def op_input(rank: int, op: str, rows: int, device=None):
    """What ``rank`` holds before ``op``: [rows, COLS] float32 small integers (0..7 for the matmul, so
    even a reduced-precision matmul is exact; 0..96 otherwise)."""
    import torch

    values = payload(rank, OP_TAGS[op], rows * COLS, torch.float32, device).view(rows, COLS)
    return values % 8 if op == "fused_all_gather_matmul" else values


def matmul_bs(device=None) -> list:
    """fused_all_gather_matmul's Bs, the same on every rank: small integers 0..7."""
    import torch

    return [(payload(100 + i, OP_TAGS["fused_all_gather_matmul"], COLS * n, torch.float32, device) % 8).view(COLS, n)
            for i, n in enumerate(MATMUL_COLS)]


def sub_groups(world: int) -> list[list[int]]:
    """Consecutive blocks of ``max(1, world // 2)`` ranks: at 2 ranks [[0], [1]], at 4 [[0, 1], [2, 3]]."""
    size = max(1, world // 2)
    return [list(range(start, min(start + size, world))) for start in range(0, world, size)]


def _unsupported_anywhere(ctx, mem, op: str, hdl) -> str | None:
    """Why ``op`` cannot run on some rank (the first rank's reason), agreed by every rank, so that either
    all ranks call the collective or none does."""
    import torch.distributed as dist

    reasons = [None] * ctx.world_size
    dist.all_gather_object(reasons, mem.unsupported(op, hdl), group=ctx.group)
    return next((f"rank {rank}: {why}" for rank, why in enumerate(reasons) if why), None)


def symm_op_on_rank(ctx, impl: str, op: str):
    """``op`` over the rank's group on a rendezvoused symmetric buffer holding ``op_input``. Returns what
    the op returned and the buffer afterwards, or why the op is unsupported, or the error it raised."""
    import torch

    mem = _open(ctx, impl)
    rows = ROWS_PER_RANK * ctx.world_size
    buf = mem.allocate((rows, COLS), torch.float32)
    buf.copy_(op_input(ctx.rank, op, rows, buf.device))
    hdl = mem.rendezvous(buf)
    mem.barrier()
    why = _unsupported_anywhere(ctx, mem, op, hdl)
    if why:
        return {"unsupported": why}
    calls = {
        "one_shot_all_reduce": lambda: mem.one_shot_all_reduce(buf, "sum"),
        "two_shot_all_reduce_": lambda: mem.two_shot_all_reduce_(buf, "sum"),
        "multimem_all_reduce_": lambda: mem.multimem_all_reduce_(buf, "sum"),
        "_low_contention_all_gather": lambda: mem.low_contention_all_gather(buf),
        "_low_contention_reduce_scatter": lambda: mem.low_contention_reduce_scatter(buf, "sum"),
        "get_remote_tensors": lambda: [t.clone() for t in mem.get_remote_tensors(buf)],
    }
    out, error = None, None
    try:
        out = calls[op]()
        if isinstance(out, torch.Tensor):
            out = out.clone()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    result = {"out": out, "buffer": buf.clone(), "error": error}
    mem.barrier()  # nobody frees or refills its buffer while a peer may still read it
    return result


def fused_all_gather_matmul_on_rank(ctx, impl: str):
    """fused_all_gather_matmul of this rank's [rows, COLS] shard with two Bs, gather_dim 0, with return_A
    and without."""
    mem = _open(ctx, impl)
    op = "fused_all_gather_matmul"
    why = _unsupported_anywhere(ctx, mem, op, None)
    if why:
        return {"unsupported": why}
    A = op_input(ctx.rank, op, ROWS_PER_RANK * ctx.world_size, ctx.device)
    Bs = matmul_bs(A.device)
    result = {}
    for return_A in (True, False):
        try:
            gathered, outs = mem.fused_all_gather_matmul(A, Bs, 0, return_A=return_A)
            result[return_A] = {"A": None if gathered is None else gathered.clone(),
                                "outs": [o.clone() for o in outs], "error": None}
        except Exception as exc:
            result[return_A] = {"error": f"{type(exc).__name__}: {exc}"}
    mem.barrier()
    return result


def subgroup_on_rank(ctx, impl: str):
    """Every rank makes every sub-group (new_group is collective), rendezvouses a buffer on its own, then
    get_remote_tensors and a one-shot all_reduce on that sub-group."""
    import torch
    import torch.distributed as dist

    op = "rendezvous(sub-group)"
    blocks = sub_groups(ctx.world_size)
    groups = [dist.new_group(block) for block in blocks]
    mine = next(i for i, block in enumerate(blocks) if ctx.rank in block)
    group = groups[mine]
    mem = _open(ctx, impl)
    rows = ROWS_PER_RANK * ctx.world_size
    buf = mem.allocate((rows, COLS), torch.float32)
    buf.copy_(op_input(ctx.rank, op, rows, buf.device))
    result = {"members": blocks[mine], "error": None}
    try:
        hdl = mem.rendezvous(buf, group)
        mem.barrier()
        result["handle"] = (hdl.rank, hdl.world_size)
        result["remote"] = [t.clone() for t in mem.get_remote_tensors(buf, group)]
        mem.barrier()  # every member has read the buffers before the all_reduce
        result["all_reduce"] = mem.one_shot_all_reduce(buf, "sum", group).clone()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    mem.barrier()
    return result


# -- checks in the controller ---------------------------------------------------------------------

def _run(ranks, fn, *args):
    return ranks.run_with_timeout(BODY_TIMEOUT, fn, *args)


def check_pairwise(ranks, impl: str, direction: str = "odd->even", numel: int = 1024,
                   dtype_name: str = "float32", late_put: float = 0.0) -> None:
    results = _run(ranks, pairwise_on_rank, impl, direction, numel, dtype_name, late_put)
    dtype = _dtype(dtype_name)
    what = (f"wait_signal posted {late_put} s before the matching put_signal (impl {impl})" if late_put else
            f"put_signal/wait_signal {direction} ({numel} x {dtype_name}, impl {impl})")
    problems = []
    receivers = 0
    for rank, res in enumerate(results):
        if res["role"] == "receiver":
            receivers += 1
            if res["error"]:
                problems.append(f"rank {rank}: wait_signal(peer={res['peer']}) failed: {res['error']}")
                continue
            if bool((res["dst"] == SENTINEL).all()):
                problems.append(f"rank {rank}: wait_signal(peer={res['peer']}) returned before the data arrived "
                                "(the buffer still holds its initial value)")
                continue
            try:
                assert_close(res["dst"], payload(res["peer"], 0, numel, dtype), exact=True, rank=rank,
                             what=f"{what}: the buffer after wait_signal returned for the put from rank {res['peer']}")
            except ConformanceFailure as exc:
                problems.append(str(exc))
        elif not bool((res["dst"] == SENTINEL).all()):
            problems.append(f"rank {rank} ({res['role']}): its destination buffer changed although no rank "
                            f"puts to it in {direction} (a put reached the wrong peer)")
    if receivers == 0:
        problems.append(f"{what}: no rank received anything; needs at least 2 ranks")
    if problems:
        raise ConformanceFailure(f"{what}:\n" + "\n".join(problems))


def check_ring(ranks, impl: str, numel: int = 256) -> None:
    import torch

    world = ranks.world_size
    results = _run(ranks, ring_on_rank, impl, numel)
    what = f"ring of put_signal/wait_signal to every peer (impl {impl})"
    problems = []
    for rank, res in enumerate(results):
        for shift in range(1, world):
            frm = (rank - shift) % world
            if frm in res["errors"]:
                problems.append(f"rank {rank}: wait_signal(peer={frm}) failed: {res['errors'][frm]}")
                continue
            try:
                assert_close(res["arrived"][frm], payload(frm, shift, numel, torch.float32), exact=True,
                             rank=rank, what=f"data from rank {frm} (shift {shift}) after wait_signal")
            except ConformanceFailure as exc:
                problems.append(str(exc))
    if problems:
        raise ConformanceFailure(f"{what}:\n" + "\n".join(problems))


def check_rounds(ranks, impl: str, rounds: int = ROUNDS, numel: int = 64) -> None:
    import torch

    results = _run(ranks, rounds_on_rank, impl, rounds, numel)
    what = f"{rounds} rounds through one buffer and one signal (impl {impl})"
    problems = []
    for rank, res in enumerate(results):
        if res["role"] != "receiver":
            continue
        for r, error in res["errors"]:
            problems.append(f"rank {rank}: round {r}: wait_signal(peer={res['peer']}) failed: {error}")
        for r, seen in enumerate(res["seen"]):
            if not torch.equal(seen, payload(res["peer"], r, numel, torch.float32)):
                stale = [old for old in range(r) if torch.equal(seen, payload(res["peer"], old, numel, torch.float32))]
                hint = f" (it holds round {stale[-1]}'s data: the wait returned on an old signal)" if stale else ""
                problems.append(f"rank {rank}: round {r}: buffer after wait_signal(peer={res['peer']}) is not "
                                f"round {r}'s data{hint}")
                break
    if problems:
        raise ConformanceFailure(f"{what}:\n" + "\n".join(problems))


def check_wait_before_put(ranks, impl: str, numel: int = 512) -> None:
    check_pairwise(ranks, impl, "odd->even", numel, "float32", late_put=LATE_PUT_SECONDS)


def _is_clear(message: str, case: str) -> bool:
    """A clear error names what was wrong: the peer (or rank) for a bad peer, symmetry for a tensor."""
    text = message.lower()
    if case.startswith("rendezvous"):
        return any(word in text for word in ("symmetric", "symm", "allocat", "p2p"))
    bad = case.split("peer=")[1].rstrip(")")
    return "peer" in text or "rank" in text or bad in text


def check_errors(ranks, impl: str) -> None:
    world = ranks.world_size
    results = _run(ranks, errors_on_rank, impl)
    problems = []
    for rank, outcome in enumerate(results):
        for case, error in outcome.items():
            if error is None:
                problems.append(f"rank {rank}: {case} returned without an error")
            elif not _is_clear(error.split(": ", 1)[-1], case):
                problems.append(f"rank {rank}: {case} raised an error that does not say what is wrong: {error}")
    if problems:
        raise ConformanceFailure(f"symmetric memory error cases on {world} ranks (impl {impl}):\n"
                                 + "\n".join(problems))


# -- checks of the collectives on symmetric buffers -----------------------------------------------

def _header(ranks, impl: str, op: str) -> str:
    return f"symm_mem.{op} on {ranks.world_size} ranks over {ranks.backend} (impl {impl})"


def _skip_if_unsupported(ranks, impl: str, op: str, results) -> None:
    why = next((res["unsupported"] for res in results if res.get("unsupported")), None)
    if why:
        import pytest

        pytest.skip(f"{_header(ranks, impl, op)}: unsupported here: {why}")


def _compare(problems: list, actual, expected, rank: int, what: str) -> None:
    try:
        assert_close(actual, expected, exact=True, rank=rank, what=what)
    except ConformanceFailure as exc:
        problems.append(str(exc))


def _raise_problems(problems: list, header: str) -> None:
    if problems:
        raise ConformanceFailure(f"{header}:\n" + "\n".join(problems))


def check_symm_op(ranks, impl: str, op: str) -> None:
    """``op`` (one of the ops ``symm_op_on_rank`` runs) gives on every rank what the ranks' inputs give:
    the all-reduces the sum (the in-place ones in the buffer too, the one-shot leaving its input as it
    was), the all_gather every input in rank order, the reduce_scatter this rank's chunk of the sum,
    get_remote_tensors every rank's buffer in rank order. Skips when ``unsupported`` says why."""
    import torch

    world = ranks.world_size
    results = _run(ranks, symm_op_on_rank, impl, op)
    _skip_if_unsupported(ranks, impl, op, results)
    rows = ROWS_PER_RANK * world
    inputs = [op_input(r, op, rows) for r in range(world)]
    total = torch.stack(inputs).sum(dim=0)
    problems = []
    for rank, res in enumerate(results):
        if res["error"]:
            problems.append(f"rank {rank}: {op} raised {res['error']}")
            continue
        out = res["out"]
        if op in ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_"):
            _compare(problems, out, total, rank, f"{op}(sum): the returned tensor")
            left = total if op.endswith("_") else inputs[rank]
            how = "in place: the reduction" if op.endswith("_") else "its input as it was"
            _compare(problems, res["buffer"], left, rank, f"{op}(sum): the input buffer afterwards ({how})")
        elif op == "_low_contention_all_gather":
            _compare(problems, out, torch.cat(inputs), rank,
                     f"{op}: the gathered tensor (every rank's input in rank order)")
        elif op == "_low_contention_reduce_scatter":
            _compare(problems, out, total.chunk(world)[rank], rank, f"{op}(sum): this rank's chunk of the sum")
        elif op == "get_remote_tensors":
            if len(out) != world:
                problems.append(f"rank {rank}: {op} returned {len(out)} tensors for {world} ranks")
                continue
            for peer, tensor in enumerate(out):
                _compare(problems, tensor, inputs[peer], rank, f"{op}: the tensor for rank {peer} (its buffer)")
    _raise_problems(problems, _header(ranks, impl, op))


def check_fused_all_gather_matmul(ranks, impl: str) -> None:
    """fused_all_gather_matmul(A_shard, [B1, B2], gather_dim=0) returns the shards gathered in rank order
    and that gathered A times each B (with return_A=False: None and the same products), on every rank."""
    import torch

    op = "fused_all_gather_matmul"
    world = ranks.world_size
    results = _run(ranks, fused_all_gather_matmul_on_rank, impl)
    _skip_if_unsupported(ranks, impl, op, results)
    rows = ROWS_PER_RANK * world
    gathered = torch.cat([op_input(r, op, rows) for r in range(world)])
    products = [(gathered.double() @ B.double()).float() for B in matmul_bs()]
    problems = []
    for rank, res in enumerate(results):
        for return_A, got in res.items():
            call = f"{op}(gather_dim=0, return_A={return_A})"
            if got["error"]:
                problems.append(f"rank {rank}: {call} raised {got['error']}")
                continue
            if return_A:
                _compare(problems, got["A"], gathered, rank, f"{call}: the gathered A (every shard in rank order)")
            elif got["A"] is not None:
                problems.append(f"rank {rank}: {call} returned an A of shape {tuple(got['A'].shape)}, expected None")
            if len(got["outs"]) != len(products):
                problems.append(f"rank {rank}: {call} returned {len(got['outs'])} products for {len(products)} Bs")
                continue
            for i, (out, want) in enumerate(zip(got["outs"], products)):
                _compare(problems, out, want, rank, f"{call}: the product with B{i + 1} (gathered A @ B{i + 1})")
    _raise_problems(problems, _header(ranks, impl, op))


def check_subgroup_rendezvous(ranks, impl: str) -> None:
    """A buffer rendezvoused on a sub-group (at 2 ranks a group of one, at 4 a pair) gets a handle with
    the rank's group rank and the group's size; get_remote_tensors on the group gives the members' buffers
    only, in group order; a one-shot all_reduce on the group sums the members' inputs only."""
    import torch

    op = "rendezvous(sub-group)"
    world = ranks.world_size
    rows = ROWS_PER_RANK * world
    results = _run(ranks, subgroup_on_rank, impl)
    problems = []
    for rank, res in enumerate(results):
        members = res["members"]
        where = f"on the sub-group of ranks {members}"
        if res["error"]:
            problems.append(f"rank {rank}: {op} {where} raised {res['error']}")
            continue
        want = (members.index(rank), len(members))
        if tuple(res["handle"]) != want:
            problems.append(f"rank {rank}: the handle of a rendezvous {where} says rank {res['handle'][0]} of "
                            f"{res['handle'][1]}, expected rank {want[0]} of {want[1]}")
        inputs = [op_input(r, op, rows) for r in members]
        if len(res["remote"]) != len(members):
            problems.append(f"rank {rank}: get_remote_tensors {where} returned {len(res['remote'])} tensors for "
                            f"{len(members)} members")
        else:
            for i, tensor in enumerate(res["remote"]):
                _compare(problems, tensor, inputs[i], rank,
                         f"get_remote_tensors {where}: the tensor for group rank {i} (global rank {members[i]})")
        _compare(problems, res["all_reduce"], torch.stack(inputs).sum(dim=0), rank,
                 f"one_shot_all_reduce(sum) {where}: the sum of the members' inputs")
    _raise_problems(problems, _header(ranks, impl, op))
