"""Verdicts of the parallelisms suite (in the controller): a parallel training record against the
single-process reference, compared as the check's declared exactness (``EXACTNESS``) says; what is a
copy, not a computation (a shard saved and loaded back, a full state dict), always bitwise.

A parallel run can add the same numbers in another order than one process does (a collective summing
per-rank gradients, a contraction split over tensor-parallel ranks). Where the reference reproduces the
run's order on CPU (it sums each rank's chunk gradients as the reduction does, and two addends sum the
same either way round), the CPU comparison is bitwise; elsewhere it is within the descriptor's
``tolerances`` entry, and the message says why a CPU run is not bitwise. Every message names the
exactness it used.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.checks import ConformanceFailure, assert_close

ANY = 1 << 30  # bitwise at any world size


@dataclass(frozen=True)
class Exactness:
    """How one check compares on CPU: bitwise up to ``bitwise_ranks`` ranks (``because``), at more ranks
    within the descriptor's float32 tolerance (``why_not``: why the order does not allow bitwise).
    Accelerators always use the descriptor's tolerance (their kernels need not add in the reference's
    order); a descriptor that declares none is compared bitwise."""

    bitwise_ranks: int
    because: str = ""
    why_not: str = ""


_DATA_PARALLEL_WHY_NOT = ("gloo adds more than two ranks' gradients in a ring whose starting rank changes along the "
                          "reduced buffer, which no reference order reproduces element for element")

EXACTNESS = {
    "ddp": Exactness(2, "the reference sums the ranks' chunk gradients, and two addends sum the same either way "
                        "round", _DATA_PARALLEL_WHY_NOT),
    "fsdp": Exactness(2, "the reference sums the ranks' chunk gradients, and two addends sum the same either way "
                         "round", _DATA_PARALLEL_WHY_NOT),
    "fsdp_mixed_precision": Exactness(ANY, "the reference makes the same casts, and the ranks' bfloat16 gradients "
                                           "(8 significant bits) sum in float32 without rounding here, so the "
                                           "order cannot show"),
    "tensor_parallel": Exactness(0, "", "a contraction split over the ranks (fc2 rowwise, fc1's input gradient) "
                                      "is added in another order than one matmul adds it, and a shard's matmul "
                                      "need not round like the rows of the full one"),
    "pipeline": Exactness(ANY, "the reference runs one backward per micro-batch, in the schedule's order"),
    "fsdp_tp": Exactness(0, "", "the tensor-parallel contraction is split over the tp ranks, added in another "
                              "order than one matmul adds it"),
}


def _tolerance(descriptor, world_size: int, exactness: str) -> tuple[tuple[float, float] | None, str]:
    """(rtol, atol), or None for bitwise, and the sentence saying which, under which declared exactness."""
    policy = EXACTNESS[exactness]
    if descriptor.device_type == "cpu" and world_size <= policy.bitwise_ranks:
        return None, f"bitwise (exactness {exactness!r}, CPU at {world_size} ranks: {policy.because})"
    declared = descriptor.tolerances.get("float32")
    if declared is None:
        return None, f"bitwise ({descriptor.name} declares no float32 tolerance)"
    why = f"; CPU: not bitwise because {policy.why_not}" if descriptor.device_type == "cpu" else ""
    return ((declared.rtol, declared.atol),
            f"within {descriptor.name}'s float32 tolerance rtol={declared.rtol}, atol={declared.atol} "
            f"({descriptor.source or 'its descriptor'}; exactness {exactness!r}{why})")


def _layer(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _tensor_problem(actual, expected, what: str, tol) -> str | None:
    if actual is None or expected is None:
        if actual is None and expected is None:
            return None
        return f"{what} is {'None' if actual is None else 'a tensor'}, the reference's is " \
               f"{'None' if expected is None else 'a tensor'}"
    try:
        assert_close(actual, expected, what=what, exact=tol is None, tol=tol)
    except ConformanceFailure as exc:
        return str(exc)
    return None


def _dict_problems(actual: dict, expected: dict, label: str, tol) -> list[str]:
    problems = [f"{label} {name} (layer {_layer(name)}) is missing" for name in expected if name not in actual]
    for name, want in expected.items():
        if name in actual and (p := _tensor_problem(actual[name], want, f"{label} {name} (layer {_layer(name)})",
                                                    tol)) is not None:
            problems.append(p)
    return problems


def record_problems(run: dict, reference: dict, tol, *, steps_named: str = "step") -> list[str]:
    """What differs: the first step whose gradients differ (every gradient that does), the losses, and
    the parameters after the last step; [] when the run is the reference."""
    problems: list[str] = []
    for step, (grads, want) in enumerate(zip(run["grads"], reference["grads"]), start=1):
        if found := _dict_problems(grads, want, "gradient of", tol):
            problems += [f"{steps_named} {step}: {p}" for p in found]
            break
    for index, (loss, want) in enumerate(zip(run["losses"], reference["losses"])):
        if _tensor_problem(_scalar(loss), _scalar(want), "loss", tol) is not None:
            problems.append(f"micro-batch {index}'s loss is {loss!r}, the unsplit model's is {want!r}"
                            if steps_named == "micro-batch" else f"step {index + 1}'s loss is {loss!r}, the "
                            f"reference's is {want!r}")
    if len(run["losses"]) != len(reference["losses"]):
        problems.append(f"{len(run['losses'])} losses, the reference has {len(reference['losses'])}")
    problems += _dict_problems(run["params"], reference["params"], f"after {len(run['grads'])} steps, parameter",
                               tol)
    return problems


def _scalar(value):
    import torch

    return torch.tensor(value, dtype=torch.float32)


def assert_runs_match(ranks, per_rank: list[dict], what: str, *, exactness: str, problems=None) -> None:
    """Every rank's ``run`` equals its ``reference``, compared as ``EXACTNESS[exactness]`` declares
    (``problems(result, tol)`` adds checks of its own); the message names the backend, world size, how
    it compared, each rank and what differs."""
    tol, how = _tolerance(ranks.descriptor, ranks.world_size, exactness)
    lines = []
    for rank, result in enumerate(per_rank):
        found = record_problems(result["run"], result["reference"], tol,
                                steps_named=result.get("steps_named", "step"))
        if problems is not None:
            found = problems(result, tol) + found
        lines += [f"rank {rank}: {p}" for p in found[:6]] + ([f"rank {rank}: ... {len(found) - 6} more"]
                                                            if len(found) > 6 else [])
    if lines:
        raise ConformanceFailure(f"{what} over {ranks.backend} ({ranks.world_size} ranks) differs from the "
                                 f"single-process reference, compared {how}:\n  " + "\n  ".join(lines))


def finalization_problems(result: dict, tol) -> list[str]:
    """Manual finalization: before ``finalize_backward`` some gradient must still differ from what it
    holds after (the last reduction's write-back is the caller's to trigger; an FSDP2 gradient still
    unsharded then is recorded as this rank's rows of it); whether the values after are right is the
    record's own comparison."""
    problems = []
    for step, (before, after) in enumerate(zip(result["before_finalize"], result["after_finalize"]), start=1):
        final = [name for name, g in before.items() if g is not None and after.get(name) is not None
                 and _tensor_problem(g, after[name], name, None) is None]
        if before and len(final) == len(before):
            problems.append(f"step {step}: finalize_backward changed no gradient ({', '.join(final[:3])}, ... hold "
                            "the same values before and after it): the reduction was not deferred to it, or it "
                            "wrote nothing back")
    return problems


def mixed_precision_problems(result: dict, tol) -> list[str]:
    """FSDP2 mixed precision: a gradient reduced in bfloat16 comes back holding only bfloat16 values,
    where the float32 reduction of the contract's policy (and the reference) holds values between them."""
    for step, (grads, want) in enumerate(zip(result["run"]["grads"], result["reference"]["grads"]), start=1):
        low = [name for name, g in grads.items() if g is not None and want.get(name) is not None
               and _representable_in_bfloat16(g) and not _representable_in_bfloat16(want[name])]
        if low:
            return [f"step {step}: gradients of {', '.join(low[:3])}{', ...' if len(low) > 3 else ''} hold only "
                    "bfloat16 values, the reference's float32 reduction does not: they were reduced in bfloat16, not "
                    "in the policy's float32 reduce_dtype"]
    return []


def _representable_in_bfloat16(t) -> bool:
    import torch

    return bool(torch.equal(t.to(torch.bfloat16).to(t.dtype), t))


def shard_problems(result: dict, tol) -> list[str]:
    """FSDP2's state-dict round trip: the full state dict is the trained model, and loading it into a
    differently initialised sharded model gives back this rank's shards (copies: bitwise)."""
    problems = _dict_problems(result["full_state_dict"], result["run"]["params"], "full state dict entry", None)
    for name, shard in result["shards"].items():
        loaded = result["loaded_shards"].get(name)
        problem = _tensor_problem(loaded, shard, f"local shard of {name} after loading the full state dict", None)
        if problem is not None:
            problems.append(f"{problem} (full shape {tuple(result['run']['params'][name].shape)}, "
                            f"the shard it was saved from has shape {tuple(shard.shape)})")
    return problems
