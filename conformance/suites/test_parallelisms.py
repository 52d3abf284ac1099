"""DDP, FSDP2, tensor parallelism and pipelining train the way one process does.

Each test trains a small model (``_parallel_models``) for a few SGD steps over the pool's process group
(``_parallel_bodies``) and compares every step's gradients and the final parameters with a single
process on the concatenated batch, as the check's declared exactness says: bitwise on CPU where the
addition order allows, else within the descriptor's ``tolerances`` (``_parallel_checks.EXACTNESS``).
APIs a torch lacks are skipped with the version that added them.
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires, world_size
from conformance.suites import _parallel_bodies as bodies
from conformance.suites._parallel_checks import (assert_runs_match, finalization_problems, mixed_precision_problems,
                                                  shard_problems)

pytestmark = [requires("parallelisms"), min_ranks(2)]


def _needs(owner, attribute: str, added_in: str) -> None:
    import torch

    if not hasattr(owner, attribute):
        pytest.skip(f"{owner.__name__}.{attribute} was added in torch {added_in}; this torch is {torch.__version__}")


def _ddp_class():
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _fsdp_class():
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


# -- DDP ---------------------------------------------------------------------------------------------

def check_ddp(ranks, *, hook: str = "torch", finalize: str = "torch", **options) -> None:
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    manual = options.get("manual", False)
    assert_runs_match(ranks, ranks.run(bodies.ddp, hook=hook, finalize=finalize, **options),
                      f"DDP({shown})" + (" after finalize_backward" if manual else ""), exactness="ddp",
                      problems=finalization_problems if manual else None)


@pytest.mark.parametrize("bucket_cap_mb", [0.0001, 0.001, 25.0], ids=["bucket-per-param", "small-buckets",
                                                                      "one-bucket"])
def test_ddp_parity(ranks, bucket_cap_mb):
    check_ddp(ranks, bucket_cap_mb=bucket_cap_mb)


def test_ddp_no_sync_accumulation(ranks):
    check_ddp(ranks, no_sync=True)


def test_ddp_find_unused_parameters(ranks):
    check_ddp(ranks, unused=True)


def test_ddp_manual_finalization(ranks):
    _needs(_ddp_class(), "finalize_backward", "2.15")
    check_ddp(ranks, manual=True)


# -- FSDP2 -------------------------------------------------------------------------------------------

def check_fsdp(ranks, *, finalize: str = "torch", loader: str = "torch", policy: str = "torch", **options) -> None:
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    extra = []
    if options.get("manual"):
        extra.append(finalization_problems)
    if options.get("state_dict"):
        extra.append(shard_problems)
    if options.get("mixed_precision"):
        extra.append(mixed_precision_problems)
    assert_runs_match(ranks, ranks.run(bodies.fsdp, finalize=finalize, loader=loader, policy=policy, **options),
                      f"FSDP2 fully_shard({shown})",
                      exactness="fsdp_mixed_precision" if options.get("mixed_precision") else "fsdp",
                      problems=(lambda result, tol: [p for check in extra for p in check(result, tol)]))


@pytest.mark.parametrize("reshard_after_forward", [True, False], ids=["reshard", "no-reshard"])
def test_fsdp_parity_uneven_shards(ranks, reshard_after_forward):
    check_fsdp(ranks, reshard_after_forward=reshard_after_forward)


@requires("bf16")
def test_fsdp_mixed_precision(ranks):
    check_fsdp(ranks, mixed_precision=True)


def test_fsdp_manual_finalization(ranks):
    _needs(_fsdp_class(), "set_manual_backward_finalization", "2.15")
    check_fsdp(ranks, manual=True)


def test_fsdp_state_dict_round_trip(ranks):
    check_fsdp(ranks, state_dict=True)


# -- tensor parallelism ------------------------------------------------------------------------------

def check_tensor_parallel(ranks, style: str, region: str = "torch") -> None:
    assert_runs_match(ranks, ranks.run(bodies.tensor_parallel, style=style, region=region),
                      f"tensor parallelism ({style}: fc1 colwise, fc2 rowwise)", exactness="tensor_parallel")


@pytest.mark.parametrize("style", ["parallelize_module", "megatron"])
def test_tensor_parallel(ranks, style):
    check_tensor_parallel(ranks, style)


# -- pipelining --------------------------------------------------------------------------------------

def check_pipeline(ranks, schedule: str, feed: str = "torch") -> None:
    import torch.distributed.pipelining as pipelining

    _needs(pipelining, schedule, "2.4")
    per_rank = ranks.run(bodies.pipeline, schedule=schedule, feed=feed)
    for result in per_rank:
        result["steps_named"] = "micro-batch"
    assert_runs_match(ranks, per_rank, f"pipelining ({schedule}, {bodies.MICROBATCHES} micro-batches)",
                      exactness="pipeline")


@pytest.mark.parametrize("schedule", ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"])
def test_pipeline(ranks, schedule):
    check_pipeline(ranks, schedule)


# -- FSDP2 x TP --------------------------------------------------------------------------------------

@world_size(4)
def test_fsdp_tensor_parallel_2d_mesh(ranks):
    assert_runs_match(ranks, ranks.run(bodies.fsdp_tp), "FSDP2 (dp) x tensor parallelism (tp) on a 2 x 2 mesh",
                      exactness="fsdp_tp")
