"""Precompile reproducibility: compile once, ship the artifact to every rank, run it with no
compilation, and get the same bits everywhere.

Every way the installed torch offers is its own case (``_precompile_paths``): ``precompile``
(``torch.compiler.precompile``, newer than torch 2.13: skipped with the reason when absent),
``aot_compile`` (+ ``save_compiled_function`` / ``load_compiled_function``), ``megacache``
(``save_cache_artifacts`` / ``load_cache_artifacts``: a warm start, so Dynamo traces but Inductor
compiles nothing) and ``aoti`` (AOTInductor ``.pt2`` packages).

For each path and each model (an MLP with LayerNorm and GELU, a small transformer block with
attention, and a model with a functional all_reduce inside): rank 0 compiles into the pool's shared
directory, every rank loads; no compilation at load or first call (Dynamo and Inductor counters),
output hashes gathered over the process group are equal, outputs are bitwise equal to rank 0's JIT
compile and close to eager. Then: two independent builds share their build key (and their bytes,
for forms that promise it: the test records ``byte_identical`` either way); inputs outside what the
artifact was built for either work as its dynamic dimensions allow or raise a clear error, never
recompiling; an uneven split (the last rank gets fewer rows) runs on every rank with rank 0's bits; and
a rank whose artifact waits in its collective for a late rank lets its other threads run (the GIL).

The bodies live in ``_precompile_bodies`` so the project's own tests run them on broken paths.
Builds are cached per rank pool, and the run shares one Inductor cache directory: a case is a few
seconds, except AOTInductor builds (about 10 s each on a CPU).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires, shared_dir
from conformance.suites import _precompile_bodies as bodies

pytestmark = [requires("compile"), shared_dir]  # rank 0 builds, the others load its artifacts from ctx.shared_dir

PATHS = ["precompile", "aot_compile", "megacache", "aoti"]
MODELS = ["mlp", "transformer", "allreduce"]
MLP_CASES = {"batch 7": "works", "batch 1": "works or raises", "float64": "works or raises",
             "features 17": "works or raises"}
TRANSFORMER_CASES = {"sequence 5": "works or raises", "batch 3": "works or raises"}


def _available(path_name: str):
    from conformance.suites._precompile_paths import resolve

    reason = resolve(path_name).unavailable_reason()
    if reason:
        pytest.skip(reason)


def _needs_collectives_in_compile(ranks, model_name: str):
    if model_name == "allreduce" and not ranks.capabilities.usable("collectives")[0]:
        pytest.skip(f"the allreduce model needs collectives: {ranks.capabilities.usable('collectives')[1]}")


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("path_name", PATHS)
def test_load_runs_without_compiling_and_matches(ranks, path_name, model_name, record_property):
    _available(path_name)
    _needs_collectives_in_compile(ranks, model_name)
    record = bodies.check_load(ranks, path_name, model_name)
    record_property("artifact_bytes", record["bytes"])


@pytest.mark.parametrize("path_name", PATHS)
def test_two_builds_are_reproducible(ranks, path_name, record_property):
    _available(path_name)
    summary = bodies.check_determinism(ranks, path_name, "mlp")
    record_property("byte_identical", summary["byte_identical"])
    record_property("key_identical", summary["key_identical"])


@pytest.mark.parametrize("path_name", PATHS)
def test_out_of_spec_input_works_or_fails_clearly(ranks, path_name):
    _available(path_name)
    bodies.check_out_of_spec(ranks, path_name, "mlp", MLP_CASES)
    bodies.check_out_of_spec(ranks, path_name, "transformer", TRANSFORMER_CASES)


@pytest.mark.parametrize("inputs", ["own-tensors", "views-of-one-batch"])
@pytest.mark.parametrize("path_name", PATHS)
def test_uneven_batches_across_ranks(ranks, path_name, inputs):
    """The last rank gets fewer rows. ``views-of-one-batch``: each rank's rows are a slice of one
    global batch, so every rank but 0 passes a tensor with a storage offset."""
    _available(path_name)
    bodies.check_divergent(ranks, path_name, "mlp", views=inputs == "views-of-one-batch")


@min_ranks(2)
@pytest.mark.parametrize("path_name", PATHS)
def test_collective_wait_lets_other_threads_run(ranks, path_name, record_property):
    """Rank 0 runs the allreduce model's artifact while the last rank holds back its part until a
    side thread of rank 0 has run: a call that keeps the GIL while it waits on another rank stops
    every thread of the process, and deadlocks the rank when the collective needs one of them.
    ``side_thread`` says where rank 0's call was when its thread ran: ``in-call`` (waiting, GIL
    released) or ``after-call`` (the collective does not block the host, as on NCCL)."""
    _available(path_name)
    _needs_collectives_in_compile(ranks, "allreduce")
    finding = bodies.check_collective_wait_releases_gil(ranks, path_name)
    record_property("side_thread", finding["side_thread"])
