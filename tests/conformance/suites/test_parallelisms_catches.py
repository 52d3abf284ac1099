"""The parallelisms suite catches what it claims, each with its own message: a Megatron region without
its backward all-reduce (the layer before it and its gradients named), a DDP hook that returns a
bucket's gradients in the wrong order, an FSDP2 loader
that shards as if nothing needed padding (the uneven parameter named), an FSDP2 mixed-precision policy
that reduces in bfloat16 (the gradients holding only bfloat16 values named), a pipeline whose first stage
reorders its micro-batches (the micro-batch named), and a finalization that returns before the
reduction (DDP and FSDP2, torch >= 2.15).

The broken pieces live in ``tests.conformance.suites._broken_parallel``; the suite's rank functions import them on
every rank and run them over the pool's real process group.
"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import test_parallelisms as suite

BROKEN = "tests.conformance.suites._broken_parallel:"


def test_a_megatron_region_without_its_backward_all_reduce_names_the_layer_before_it(ranks):
    with pytest.raises(ConformanceFailure) as caught:
        suite.check_tensor_parallel(ranks, "megatron", region=BROKEN + "MissingBackwardAllReduce")
    message = str(caught.value)
    assert message.startswith(f"tensor parallelism (megatron: fc1 colwise, fc2 rowwise) over gloo ({ranks.world_size} "
                              "ranks) differs from the single-process reference, compared within cpu's float32 "
                              "tolerance rtol=1e-05, atol=1e-06")
    assert "rank 0: step 1: gradient of fc0.weight (layer fc0) is wrong: " in message
    assert "rank 0: step 1: gradient of fc0.bias (layer fc0) is wrong: " in message
    # Only the layer before the region is wrong at step 1: the region's own and later gradients are right.
    assert "step 1: gradient of fc1" not in message and "step 1: gradient of head" not in message


def test_a_bucket_returned_in_reverse_order_names_the_gradients_it_misplaced(ranks):
    with pytest.raises(ConformanceFailure, match=r"DDP\(bucket_cap_mb=25\.0\) over gloo \(\d ranks\) differs from "
                                                 r"the single-process reference, .*\n  rank 0: step 1: gradient of "
                                                 r"fc0\.weight \(layer fc0\) is (wrong|a tensor)"):
        suite.check_ddp(ranks, bucket_cap_mb=25.0, hook=BROKEN + "reversed_bucket_order")


def test_an_fsdp_shard_that_drops_the_padding_names_the_uneven_parameter(ranks):
    with pytest.raises(ConformanceFailure) as caught:
        suite.check_fsdp(ranks, state_dict=True, loader=BROKEN + "floor_shards")
    message = str(caught.value)
    assert "rank 0: local shard of fc2.weight after loading the full state dict is wrong: " in message
    assert "(full shape (5, 12), the shard it was saved from has shape (" in message
    assert "fc1.weight after loading" not in message  # 12 rows divide by 2 and 4: floor is right there


def test_an_fsdp_mixed_precision_policy_that_reduces_in_bfloat16_is_named(ranks):
    with pytest.raises(ConformanceFailure) as caught:
        suite.check_fsdp(ranks, mixed_precision=True, policy=BROKEN + "bfloat16_reduce")
    message = str(caught.value)
    assert message.startswith(f"FSDP2 fully_shard(mixed_precision=True) over gloo ({ranks.world_size} ranks) differs "
                              "from the single-process reference, compared bitwise (exactness "
                              "'fsdp_mixed_precision', CPU at ")
    assert ("rank 0: step 1: gradients of fc0.weight, fc0.bias, fc1.weight, ... hold only bfloat16 values, the "
            "reference's float32 reduction does not: they were reduced in bfloat16, not in the policy's float32 "
            "reduce_dtype") in message


def test_a_stage_that_reorders_micro_batches_names_the_micro_batch(ranks):
    last = ranks.world_size - 1
    with pytest.raises(ConformanceFailure, match=rf"pipelining \(ScheduleGPipe, 4 micro-batches\) over gloo "
                                                 rf"\(\d ranks\) differs from the single-process reference, "
                                                 rf"(.|\n)*rank {last}: micro-batch 0's loss is .*, the unsplit "
                                                 rf"model's is "):
        suite.check_pipeline(ranks, "ScheduleGPipe", feed=BROKEN + "reversed_microbatches")


def _needs_manual_finalization():
    from torch.nn.parallel import DistributedDataParallel

    if not hasattr(DistributedDataParallel, "finalize_backward"):
        pytest.skip("manual backward finalization was added in torch 2.15")


def test_a_ddp_finalization_that_returns_before_the_reduction(ranks):
    _needs_manual_finalization()
    with pytest.raises(ConformanceFailure) as caught:
        suite.check_ddp(ranks, manual=True, finalize=BROKEN + "finalize_before_the_reduction")
    message = str(caught.value)
    assert message.startswith("DDP(manual=True) after finalize_backward over gloo (")
    assert ("rank 0: step 1: finalize_backward changed no gradient (fc0.weight, fc0.bias, fc1.weight, ... hold the "
            "same values before and after it): the reduction was not deferred to it, or it wrote nothing back") in message
    assert "rank 0: step 1: gradient of fc0.weight (layer fc0) is wrong: " in message


def test_an_fsdp_finalization_that_returns_before_the_reduction(ranks):
    _needs_manual_finalization()
    with pytest.raises(ConformanceFailure) as caught:
        suite.check_fsdp(ranks, manual=True, finalize=BROKEN + "finalize_before_the_reduction")
    message = str(caught.value)
    assert message.startswith("FSDP2 fully_shard(manual=True) over gloo (")
    # fc0's gradient is the one still pending (unsharded) before finalize_backward: its rows are compared.
    assert ("rank 0: step 1: finalize_backward changed no gradient (fc0.weight, fc0.bias, fc1.weight, ... hold the "
            "same values before and after it): the reduction was not deferred to it, or it wrote nothing "
            "back") in message
    assert "rank 0: step 1: gradient of fc0.weight (layer fc0) is wrong: " in message
