"""The symmetric-memory allocation backend is chosen once, when a rank starts, from the descriptor:
the suite's probe test allocates first in the same persistent pool, and the put_signal bodies that run
after it must still find the backend they need (torch refuses to change it after use)."""

from __future__ import annotations

import importlib

import pytest

from conformance.ranks import RankError, RankPool
from conformance.suites import _symmetric_memory_bodies as bodies
from conformance.suites import test_symmetric_memory as suite

# Imported only inside the ranks (as their setup module): importing it here would patch torch's
# symmetric-memory functions in this pytest process too, for every later test of the process.
RULE = "tests.conformance.suites.symm_backend_rule"


def calls_on_rank(ctx):
    """The symmetric-memory calls this rank made, as the rule module recorded them."""
    return list(importlib.import_module(RULE).CALLS)


CPU_REFUSAL = "SymmetricMemory does not support device type cpu"


def _pool(backend):
    return RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=60, grace=2.0,
                    setup_modules=(RULE,), symmetric_memory_backend=backend)


def test_put_signal_bodies_after_the_probe_test_find_the_backend_selected_at_start():
    with _pool("NCCL") as pool:
        # The probe test's rank function allocates first, as it does in a suite run.
        assert pool.run(suite.empty_error_on_rank) == [CPU_REFUSAL] * 2
        # A put_signal body then gets as far as allocating (CPU has no symmetric memory): it is not
        # refused for a backend change, which is what a late set_backend would meet on CUDA.
        with pytest.raises(RankError) as caught:
            pool.run(bodies.pairwise_on_rank, "torch", "odd->even", 16, "float32")
        assert all(CPU_REFUSAL in e.message for e in caught.value.errors), caught.value
        assert "can not be changed" not in str(caught.value)
        # set_backend ran once per rank, at start, before the first allocation.
        for calls in pool.run(calls_on_rank):
            assert calls[0] == ("set_backend", "NCCL") and calls.count(("set_backend", "NCCL")) == 1, calls
            assert set(calls[1:]) == {("empty",)}, calls


def test_a_backend_torch_cannot_select_is_reported_in_torchs_words():
    """Without the stand-in torch's own set_backend answers; the rank still starts and serves other tests."""
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=60,
                  symmetric_memory_backend="NCCL") as pool:
        with pytest.raises(RankError, match=r"the NCCL allocation backend that cpu's descriptor names "
                                            r"\(symmetric_memory_backend\) could not be selected when the rank "
                                            r"started: RuntimeError: SymmetricMemory does not find allocation "
                                            r"backend NCCL"):
            pool.run(bodies.pairwise_on_rank, "torch", "odd->even", 16, "float32")
        assert pool.run(suite.empty_error_on_rank) == [CPU_REFUSAL] * 2
