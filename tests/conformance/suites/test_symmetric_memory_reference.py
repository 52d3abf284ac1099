"""The symmetric-memory suite's bodies, run on a CPU reference implementation and on broken ones.

torch has no symmetric memory for CPU, so the suite's GPU tests skip here. These tests run the very
same bodies (``conformance/suites/_symmetric_memory_bodies.py``) between the rank processes of a
real gloo pool against ``tests/conformance/suites/symm_reference.py``: they must pass on the reference and fail,
with the specific complaint, on each deliberately broken variant.
"""

from __future__ import annotations

from functools import partial

import pytest

from conformance.checks import ConformanceFailure
from conformance.ranks import RankPool
from conformance.suites import _symmetric_memory_bodies as bodies
from conformance.symmetric_memory import TorchSymmetricMemory, resolve

REFERENCE = "tests.conformance.suites.symm_reference:ReferenceSymmetricMemory"


def variant(name: str) -> str:
    return f"tests.conformance.suites.symm_reference:{name}"


@pytest.fixture(scope="module")
def pool():
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2,
                  timeout=60, grace=2.0) as p:
        yield p


@pytest.mark.parametrize("direction", ["odd->even", "even->odd"])
def test_pairwise_passes_on_reference(pool, direction):
    bodies.check_pairwise(pool, REFERENCE, direction)


@pytest.mark.parametrize("numel, dtype_name", [(1, "float32"), (4099, "bfloat16"), (1 << 16, "int32"),
                                               (300, "uint8"), (33, "float64")])
def test_sizes_and_dtypes_pass_on_reference(pool, numel, dtype_name):
    bodies.check_pairwise(pool, REFERENCE, "odd->even", numel, dtype_name)


def test_ring_passes_on_reference(pool):
    bodies.check_ring(pool, REFERENCE)


def test_rounds_pass_on_reference(pool):
    bodies.check_rounds(pool, REFERENCE)


def test_wait_before_put_passes_on_reference(pool):
    bodies.check_wait_before_put(pool, REFERENCE)


def test_error_cases_pass_on_reference(pool):
    bodies.check_errors(pool, REFERENCE)


@pytest.mark.parametrize("broken, check, expected", [
    pytest.param("NoWaitSymmetricMemory", bodies.check_wait_before_put,
                 "returned before the data arrived", id="wait-that-does-not-wait"),
    pytest.param("WrongPeerSymmetricMemory", bodies.check_pairwise,
                 "its destination buffer changed although no rank puts to it", id="wrong-peer-pairwise"),
    pytest.param("WrongPeerSymmetricMemory", bodies.check_ring,
                 "wait_signal(peer=0) failed: TimeoutError", id="wrong-peer-ring"),
    pytest.param("StaleSignalSymmetricMemory", bodies.check_rounds,
                 "the wait returned on an old signal", id="stale-signal"),
    pytest.param("UncheckedPeerSymmetricMemory", bodies.check_errors,
                 "put_signal(peer=2) returned without an error", id="unchecked-peer"),
])
def test_broken_variant_is_caught(pool, broken, check, expected):
    with pytest.raises(ConformanceFailure) as caught:
        check(pool, variant(broken))
    assert expected in str(caught.value)


@pytest.mark.parametrize("op", bodies.SYMM_OPS)
def test_symm_op_passes_on_reference(pool, op):
    bodies.check_symm_op(pool, REFERENCE, op)


def test_fused_all_gather_matmul_passes_on_reference(pool):
    bodies.check_fused_all_gather_matmul(pool, REFERENCE)


def test_subgroup_rendezvous_passes_on_reference(pool):
    bodies.check_subgroup_rendezvous(pool, REFERENCE)


def test_multimem_skips_without_multicast_saying_why(pool):
    impl = variant("NoMulticastSymmetricMemory")
    with pytest.raises(pytest.skip.Exception) as skipped:
        bodies.check_symm_op(pool, impl, "multimem_all_reduce_")
    assert str(skipped.value) == (f"symm_mem.multimem_all_reduce_ on 2 ranks over gloo (impl {impl}): unsupported "
                                  "here: rank 0: multimem_all_reduce_ needs multicast: this reference has none")


def _op(op):
    return partial(bodies.check_symm_op, op=op)


@pytest.mark.parametrize("broken, check, op, expected", [
    pytest.param("SkipPeerAllReduceSymmetricMemory", _op("one_shot_all_reduce"), "one_shot_all_reduce",
                 "rank 0: one_shot_all_reduce(sum): the returned tensor is wrong",
                 id="one-shot-skips-a-peer"),
    pytest.param("LocalStoreTwoShotSymmetricMemory", _op("two_shot_all_reduce_"), "two_shot_all_reduce_",
                 "rank 0: two_shot_all_reduce_(sum): the returned tensor is wrong",
                 id="two-shot-stores-locally"),
    pytest.param("OutOfPlaceMultimemSymmetricMemory", _op("multimem_all_reduce_"), "multimem_all_reduce_",
                 "rank 1: multimem_all_reduce_(sum): the input buffer afterwards (in place: the reduction) is wrong",
                 id="multimem-not-in-place"),
    pytest.param("ReversedAllGatherSymmetricMemory", _op("_low_contention_all_gather"), "_low_contention_all_gather",
                 "rank 0: _low_contention_all_gather: the gathered tensor (every rank's input in rank order) is wrong",
                 id="all-gather-wrong-order"),
    pytest.param("OtherChunkReduceScatterSymmetricMemory", _op("_low_contention_reduce_scatter"),
                 "_low_contention_reduce_scatter",
                 "rank 1: _low_contention_reduce_scatter(sum): this rank's chunk of the sum is wrong",
                 id="reduce-scatter-other-chunk"),
    pytest.param("LocalShardMatmulSymmetricMemory", bodies.check_fused_all_gather_matmul, "fused_all_gather_matmul",
                 "rank 0: fused_all_gather_matmul(gather_dim=0, return_A=True): the product with B1 (gathered A @ B1) "
                 "is wrong: shape (8, 3), expected (16, 3)", id="matmul-of-the-local-shard"),
    pytest.param("OwnBufferRemoteTensorsSymmetricMemory", _op("get_remote_tensors"), "get_remote_tensors",
                 "rank 0: get_remote_tensors: the tensor for rank 1 (its buffer) is wrong", id="remote-is-own-buffer"),
    pytest.param("WorldRendezvousSymmetricMemory", bodies.check_subgroup_rendezvous, "rendezvous(sub-group)",
                 "rank 1: the handle of a rendezvous on the sub-group of ranks [1] says rank 1 of 2, "
                 "expected rank 0 of 1",
                 id="sub-group-maps-the-world"),
])
def test_broken_symm_op_is_caught(pool, broken, check, op, expected):
    """Each message names the backend (gloo), the operation and the rank."""
    with pytest.raises(ConformanceFailure) as caught:
        check(pool, variant(broken))
    message = str(caught.value)
    assert message.startswith(f"symm_mem.{op} on 2 ranks over gloo (impl {variant(broken)}):\n"), message
    assert expected in message, message


def test_wrong_peer_also_starves_the_receiver(pool):
    with pytest.raises(ConformanceFailure) as caught:
        bodies.check_pairwise(pool, variant("WrongPeerSymmetricMemory"))
    assert "rank 0: wait_signal(peer=1) failed: TimeoutError: wait_signal: no signal from peer 1" in str(caught.value)


def test_the_pool_is_healthy_after_a_caught_bug(pool):
    """Bodies catch their own errors on the ranks: no process group reset, no respawn."""
    spawns = pool.spawns
    with pytest.raises(ConformanceFailure):
        bodies.check_wait_before_put(pool, variant("NoWaitSymmetricMemory"))
    bodies.check_pairwise(pool, REFERENCE)
    assert pool.spawns == spawns


def test_resolve_names_the_interface():
    assert resolve("torch") is TorchSymmetricMemory
    with pytest.raises(ValueError, match="expected 'torch' or 'package.module:ATTRIBUTE'"):
        resolve("reference")
    with pytest.raises(TypeError, match="lacks allocate, rendezvous, put_signal, wait_signal, barrier, "
                                        "one_shot_all_reduce, .*, get_remote_tensors, unsupported$"):
        resolve("tests.conformance.suites.symm_reference:ReferenceHandle")


def test_cpu_skip_reason_carries_torchs_own_words():
    """On CPU the suite's symmetric-memory tests skip with torch's reason, not just the descriptor's."""
    from conformance.capabilities import probe_capabilities
    from conformance.descriptors import load_descriptors

    report = probe_capabilities(load_descriptors()["cpu"])
    assert report.probes["symmetric_memory"].reason == "SymmetricMemory does not support device type cpu"
    for capability in ("symmetric_memory", "put_signal"):
        ok, why = report.usable(capability)
        assert not ok and "SymmetricMemory does not support device type cpu" in why, why
