"""Verdicts of the parallelisms suite (in the controller): a parallel training record against the
single-process reference, within the descriptor's ``tolerances`` for the dtype, bitwise where it
declares none; what is a copy, not a computation (a shard saved and loaded back), always bitwise.

A parallel run adds the same numbers in another order than one process does (a matmul over the whole
batch against per-rank matmuls summed by a collective; a contraction split over tensor-parallel
ranks), so float32 training agrees to rounding, not bit for bit, even on CPU: every descriptor that
runs this suite declares its float32 and bfloat16 tolerances, and each message names the one used.
"""

from __future__ import annotations

from conformance.checks import ConformanceFailure, assert_close


def _tolerance(descriptor, dtype: str) -> tuple[tuple[float, float] | None, str]:
    """(rtol, atol), or None for bitwise, and the sentence saying which and where it comes from."""
    declared = descriptor.tolerances.get(dtype)
    if declared is None:
        return None, f"bitwise ({descriptor.name} declares no {dtype} tolerance)"
    return ((declared.rtol, declared.atol),
            f"within {descriptor.name}'s {dtype} tolerance rtol={declared.rtol}, atol={declared.atol} "
            f"({descriptor.source or 'its descriptor'})")


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


def assert_runs_match(ranks, per_rank: list[dict], what: str, *, dtype: str = "float32",
                      problems=None) -> None:
    """Every rank's ``run`` equals its ``reference`` (``problems(result, tol)`` adds checks of its own);
    the message names the backend, world size, how it compared, each rank and what differs."""
    tol, how = _tolerance(ranks.descriptor, dtype)
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


def shard_problems(result: dict, tol) -> list[str]:
    """FSDP2's state-dict round trip: the full state dict is the trained model, and loading it into a
    differently initialised sharded model gives back this rank's shards."""
    problems = _dict_problems(result["full_state_dict"], result["run"]["params"], "full state dict entry", tol)
    for name, shard in result["shards"].items():
        loaded = result["loaded_shards"].get(name)
        problem = _tensor_problem(loaded, shard, f"local shard of {name} after loading the full state dict", None)
        if problem is not None:
            problems.append(f"{problem} (full shape {tuple(result['run']['params'][name].shape)}, "
                            f"the shard it was saved from has shape {tuple(shard.shape)})")
    return problems
