"""The precompile suite's checks fail when they should: its bodies run on deliberately broken paths
(``tests/conformance/suites/precompile_broken.py``) between the processes of a real gloo pool, and each bug is
reported with the specific complaint. A control run on the real ``aot_compile`` path passes.
"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.ranks import RankPool
from conformance.suites import _precompile_bodies as bodies
from conformance.suites._precompile_paths import AotCompilePath, resolve


def broken(name: str) -> str:
    return f"tests.conformance.suites.precompile_broken:{name}"


@pytest.fixture(scope="module")
def pool():
    with RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2,
                  timeout=300, grace=5.0) as p:
        yield p


def test_real_aot_compile_path_passes(pool):
    record = bodies.check_load(pool, "aot_compile", "mlp")
    assert record["path"] == "aot_compile" and record["bytes"] > 0


def test_a_load_that_recompiles_is_caught(pool):
    with pytest.raises(ConformanceFailure) as caught:
        bodies.check_load(pool, broken("RecompilingLoadPath"), "mlp")
    message = str(caught.value)
    assert "rank 0: load and first call of the" in message and "compiled: Dynamo traced 1 graph(s)" in message
    assert "rank 1: load and first call of the" in message


def test_an_output_that_differs_on_one_rank_is_caught(pool):
    with pytest.raises(ConformanceFailure) as caught:
        bodies.check_load(pool, broken("RankPerturbedPath"), "mlp")
    message = str(caught.value)
    assert "output hashes gathered over the process group differ: rank(s) [1] disagree with rank 0" in message
    assert "rank 1: " in message and "against rank 0's JIT-compiled output (bitwise) is wrong" in message
    assert "rank 0: " not in message.split("against rank 0's JIT")[0].split("\n")[-1]  # rank 0 is fine


def test_a_build_that_is_not_reproducible_is_caught(pool):
    with pytest.raises(ConformanceFailure, match="differ in their build key"):
        bodies.check_determinism(pool, broken("TimestampedBuildPath"), "mlp")


def test_a_silent_recompile_for_an_input_out_of_spec_is_caught(pool):
    with pytest.raises(ConformanceFailure) as caught:
        bodies.check_out_of_spec(pool, broken("SilentFallbackPath"), "mlp", {"batch 1": "works or raises"})
    assert "called with batch 1: it tried to recompile (stopped by the fail_on_recompile stance)" in str(caught.value)


def test_the_real_path_refuses_the_same_input_clearly(pool):
    """Control for the case above: the real path raises a guard error instead of recompiling."""
    bodies.check_out_of_spec(pool, "aot_compile", "mlp", {"batch 1": "works or raises"})


def test_a_call_that_holds_the_gil_while_its_collective_waits_is_caught(pool):
    with pytest.raises(ConformanceFailure) as caught:
        bodies.check_collective_wait_releases_gil(pool, broken("GilHoldingCallPath"))
    message = str(caught.value)
    assert f"rank 0's call into the {broken('GilHoldingCallPath')} artifact of allreduce held the GIL while its " \
           "collective waited for rank 1: a Python thread of rank 0 did not run in 5." in message
    assert "deadlocks the rank" in message


def test_the_real_path_waits_for_a_late_rank_without_the_gil(pool):
    """Control for the case above: on gloo the collective blocks the host, and rank 0's thread runs meanwhile."""
    finding = bodies.check_collective_wait_releases_gil(pool, "aot_compile")
    assert finding["side_thread"] == "in-call" and finding["held_back_s"] < bodies.LATE_PEER_PATIENCE_S


def test_resolve_names_the_choices():
    assert isinstance(resolve("aot_compile"), AotCompilePath)
    with pytest.raises(ValueError, match="expected one of precompile, aot_compile, megacache, aoti"):
        resolve("jit")
    with pytest.raises(TypeError, match="not a PrecompilePath subclass"):
        resolve("tests.conformance.suites.precompile_broken:stamped_forward")
