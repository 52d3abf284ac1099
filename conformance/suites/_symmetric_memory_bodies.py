"""The bodies of the symmetric-memory suite: what each rank does, and what the controller checks.

Written once against ``conformance.symmetric_memory.SymmetricMemory`` (an ``impl`` name resolved on
each rank), so that ``test_symmetric_memory.py`` runs them on a backend's real symmetric memory and
the project's own tests run the very same bodies against a CPU reference implementation and against
deliberately broken ones. Each ``check_*`` function takes anything with ``run_with_timeout`` and
``world_size`` (the ``ranks`` fixture or a ``RankPool``), runs its rank function and raises
``ConformanceFailure`` naming the rank, the peer and what was seen.

Rank functions catch the errors they expect (and a wait that never returns is bounded by
``BODY_TIMEOUT``), so a failing body leaves the process group healthy. Buffers start filled with
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
