"""The bodies of the precompile suite: what each rank does, and what the controller checks.

Written once against ``_precompile_paths`` (a path name resolved on each rank), so that
``test_precompile.py`` runs them on the paths torch offers and the project's own tests run the very
same bodies on deliberately broken paths. Each ``check_*`` takes anything with ``run`` and
``world_size`` (the ``ranks`` fixture or a ``RankPool``) and raises ``ConformanceFailure`` naming
the path, the model, the rank and what was seen.

The promise under test: rank 0 compiles once into the pool's shared directory, every rank loads the
artifact and runs it without compiling (Dynamo's and Inductor's counters say so), and gets the same
bits as every other rank and as rank 0's JIT compile. Builds are kept per pool (keyed by path and
model) so that the suite compiles each model once per path.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from conformance.checks import ConformanceFailure, assert_close

REBUILD_DIR = "precompile-cold-builds"
ARTIFACT_DIR = "precompile"
CLEAR_ERROR_WORDS = ("size", "shape", "dtype", "stride", "guard", "mismatch", "expected", "double",
                     "float", "recompile", "dimension")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _barrier(ctx):
    import torch.distributed as dist

    dist.barrier(group=ctx.group)


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {"dynamo_calls_captured": counters["stats"]["calls_captured"],
            "dynamo_graphs": counters["stats"]["unique_graphs"],
            "inductor_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            "inductor_cache_hits": counters["inductor"]["fxgraph_cache_hit"]}


def _reset_counters():
    from torch._dynamo.utils import counters

    counters.clear()


def _digest(tensor) -> str:
    """SHA-256 of the tensor's bytes: equal hashes mean bitwise-equal outputs."""
    import torch

    t = tensor.detach().cpu().contiguous()
    return hashlib.sha256(t.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _no_grad():
    import torch

    return torch.no_grad()


# -- building (rank 0, or every rank when the build runs a collective) ----------------------------

def _artifact(ctx, path, spec, root: str = ARTIFACT_DIR) -> Path:
    key = spec.key(ctx)
    return Path(ctx.shared_dir) / root / _safe(path.name) / key / f"{key}{path.suffix}"


def builder_ranks(devices: list[str]) -> set[int]:
    """The ranks that build, given each rank's device: the first rank on each device (an artifact is
    per device index, ``ModelSpec.key``), so on CPU rank 0 alone, and on accelerators the first node's
    ranks (the others, on other nodes, load what was built for their index)."""
    return {devices.index(device) for device in dict.fromkeys(devices)}


def _builds(ctx) -> bool:
    """Whether this rank builds (``builder_ranks``); collective over the group."""
    import torch.distributed as dist

    devices: list = [None] * ctx.world_size
    dist.all_gather_object(devices, str(ctx.device), group=ctx.group)
    return ctx.rank in builder_ranks(devices)


def _build(ctx, path, spec, artifact: Path, scratch: Path) -> None:
    """The first rank on each device writes ``artifact`` (collective: ``_builds``). A build that runs a
    collective model needs every rank in the call (``build_runs_model``), so then every rank builds and
    only the builders' results are kept."""
    from conformance.suites._precompile_models import forward

    builds = _builds(ctx)
    if builds or (spec.collective and path.build_runs_model):
        target = artifact if builds else scratch / f"discard-rank{ctx.rank}{path.suffix}"
        with _no_grad():
            path.build_to(forward, spec.build(ctx), spec.example(ctx), spec.dynamic_batch, target, scratch)


def ensure_built(ctx, path, spec) -> tuple[Path, dict]:
    """Collective over the group: after it, rank 0's artifact exists; returns it and its build record."""
    import torch.distributed as dist

    artifact = _artifact(ctx, path, spec)
    _barrier(ctx)  # nobody is building: every rank sees the same answer to "is it there?"
    missing: list = [None] * ctx.world_size  # per device: any rank's artifact missing builds them all
    dist.all_gather_object(missing, not Path(str(artifact) + ".json").exists(), group=ctx.group)
    if any(missing):
        _build(ctx, path, spec, artifact, artifact.parent / "scratch")
    _barrier(ctx)
    return artifact, json.loads(Path(str(artifact) + ".json").read_text())


def _load(ctx, path, spec, artifact: Path):
    """The loaded artifact as a callable ``call(model, *inputs)``."""
    from conformance.suites._precompile_models import forward

    with _no_grad():
        return path.load(ctx, forward, artifact, artifact.parent / "load", spec.dynamic_batch)


# -- functions that run on every rank -------------------------------------------------------------

_REFERENCES: dict = {}


def reference_on_rank(ctx, model_name: str):
    """Eager output on every rank and the JIT-compiled output (fullgraph, same dynamic dims), cached
    per process. Only rank 0 compiles, unless the model runs a collective."""
    import torch

    from conformance.suites._precompile_models import forward, model_spec
    from conformance.suites._precompile_paths import _mark_dynamic_batch

    spec = model_spec(model_name)
    key = (spec.key(ctx), str(ctx.device))
    if key not in _REFERENCES:
        model, inputs = spec.build(ctx), spec.example(ctx)
        with _no_grad():
            eager = forward(model, *inputs)
            jit = None
            if ctx.rank == 0 or spec.collective:
                jit = torch.compile(forward, fullgraph=True)(model, *_mark_dynamic_batch(inputs, spec.dynamic_batch))
        _REFERENCES[key] = {"eager": eager.cpu(), "jit": None if jit is None else jit.cpu()}
    return _REFERENCES[key]


def load_on_rank(ctx, path_name: str, model_name: str):
    """Load rank 0's artifact, run it once; counters around load and first call; gather hashes."""
    import torch.distributed as dist

    from conformance.suites._precompile_models import model_spec
    from conformance.suites._precompile_paths import resolve

    path, spec = resolve(path_name), model_spec(model_name)
    artifact, record = ensure_built(ctx, path, spec)
    model, inputs = spec.build(ctx), spec.example(ctx)
    _reset_counters()
    call = _load(ctx, path, spec, artifact)
    with _no_grad():
        out = call(model, *inputs)
    seen = _counters()
    hashes = [None] * ctx.world_size
    dist.all_gather_object(hashes, _digest(out), group=ctx.group)
    return {"out": out, "hashes": hashes, "counters": seen, "record": record}


def rebuild_on_rank(ctx, path_name: str, model_name: str):
    """Two cold builds of the same model, one after the other, each in the same, freshly emptied
    Inductor cache directory (a package can record that directory's path, and a warm cache changes
    what gets written), under the same file name. Returns both build records."""
    import shutil

    import torch

    from conformance.suites._precompile_models import model_spec
    from conformance.suites._precompile_paths import inductor_cache_dir, resolve

    path, spec = resolve(path_name), model_spec(model_name)
    root = Path(ctx.shared_dir) / REBUILD_DIR / _safe(path.name) / spec.key(ctx)
    cache = root / f"cold-cache-rank{ctx.rank}"
    records = []
    for build in ("first", "second"):
        artifact = root / build / f"{spec.key(ctx)}{path.suffix}"
        shutil.rmtree(cache, ignore_errors=True)
        torch._dynamo.reset()
        _barrier(ctx)
        with inductor_cache_dir(cache):
            _build(ctx, path, spec, artifact, root / "scratch")
        _barrier(ctx)
        records.append(json.loads(Path(str(artifact) + ".json").read_text()))
    _barrier(ctx)
    if _builds(ctx):  # one root per device
        shutil.rmtree(root, ignore_errors=True)
    return {"first": records[0], "second": records[1]}


def _case_input(case: str, inputs):
    import torch

    x = inputs[0]
    if case.startswith("batch "):
        n = int(case.split()[1])
        return (torch.randn(n, *x.shape[1:], generator=torch.Generator().manual_seed(n), device="cpu").to(x.device),)
    if case.startswith("sequence "):
        n = int(case.split()[1])
        return (torch.randn(x.shape[0], n, *x.shape[2:], generator=torch.Generator().manual_seed(n),
                            device="cpu").to(x.device),)
    if case.startswith("features "):
        n = int(case.split()[1])
        return (torch.randn(*x.shape[:-1], n, device=x.device),)
    if case == "float64":
        return (x.double(),)
    raise ValueError(f"unknown out-of-spec case {case!r}")


def out_of_spec_on_rank(ctx, path_name: str, model_name: str, cases: list[str]):
    """Load the artifact, run its example once, then each input it was not built for, under the
    ``fail_on_recompile`` stance (a MegaCache warm start is a torch.compile'd function: a new input
    must fail loudly, not recompile; an artifact that compiles nothing never meets the stance).
    Returns, per case, eager's result or error and the artifact's, and the counters."""
    import torch

    from conformance.suites._precompile_models import forward, model_spec
    from conformance.suites._precompile_paths import resolve

    path, spec = resolve(path_name), model_spec(model_name)
    artifact, _ = ensure_built(ctx, path, spec)
    model, inputs = spec.build(ctx), spec.example(ctx)
    outcome = {}
    call = _load(ctx, path, spec, artifact)
    with _no_grad():
        call(model, *inputs)
        for case in cases:
            args = _case_input(case, inputs)
            try:
                eager, eager_error = forward(model, *args), None
            except Exception as exc:
                eager, eager_error = None, f"{type(exc).__name__}: {exc}"
            _reset_counters()
            try:
                with torch.compiler.set_stance("fail_on_recompile"):
                    out, error = call(model, *args), None
            except Exception as exc:
                out, error = None, f"{type(exc).__name__}: {str(exc).strip()[:800]}"
            outcome[case] = {"eager": eager, "eager_error": eager_error, "out": out, "error": error,
                             "counters": _counters()}
    return outcome


def divergent_on_rank(ctx, path_name: str, model_name: str, rows: int, views: bool):
    """Uneven split of one global batch: every rank gets ``rows`` rows, the last rank fewer. Each
    rank runs the dynamic-batch artifact on its own rows (``views``: slices of the global batch, so
    all but rank 0's start at a storage offset; else tensors of their own, as a data loader gives);
    rank 0 also runs it on every rank's rows, so the controller can check that each rank got rank
    0's bits for the same input."""
    from conformance.suites._precompile_models import forward, model_spec
    from conformance.suites._precompile_paths import resolve

    path, spec = resolve(path_name), model_spec(model_name)
    artifact, _ = ensure_built(ctx, path, spec)
    model = spec.build(ctx)
    slices = divergent_slices(ctx.world_size, rows, spec.example(ctx)[0])
    if not views:
        slices = [s.clone() for s in slices]
    mine = slices[ctx.rank].to(ctx.device)
    call = _load(ctx, path, spec, artifact)
    with _no_grad():
        _reset_counters()
        out = call(model, mine)
        seen = _counters()
        eager = forward(model, mine)
        by_rank0 = [call(model, s.to(ctx.device)) for s in slices] if ctx.rank == 0 else None
    return {"rows": mine.shape[0], "out": out, "eager": eager, "by_rank0": by_rank0, "counters": seen}


def divergent_slices(world: int, rows: int, like):
    """``rows`` rows per rank from one global batch; the last rank gets ``rows // 2`` (at least 2)."""
    import torch

    last = max(2, rows // 2)
    total = rows * (world - 1) + last
    data = torch.randn(total, *like.shape[1:], generator=torch.Generator().manual_seed(99), device="cpu")
    return list(data.split([rows] * (world - 1) + [last]))


# -- checks in the controller ---------------------------------------------------------------------

# How long the late rank holds back for the first rank's side thread before joining anyway: a thread
# that may take the GIL runs within milliseconds; one that cannot (the call holds the GIL) never does.
LATE_PEER_PATIENCE_S = 5.0
SIDE_THREAD_DELAY_S = 0.2  # after rank 0 says it enters its call, so the call has begun when it looks
WORKER_RELEASE_PAUSE_S = 0.2  # before the measured call, without the GIL: see late_peer_on_rank
# The measured call's time-out: a call that deadlocks (the hazard measured) ends the check in bounded time.
LATE_PEER_CALL_TIMEOUT_S = LATE_PEER_PATIENCE_S + 60.0
_LOADED_FOR_LATE_PEER: dict = {}


def prepare_late_peer_on_rank(ctx, path_name: str, model_name: str):
    """Build (rank 0) and load the artifact, kept for ``late_peer_on_rank``; clear its signal file."""
    from conformance.suites._precompile_models import model_spec
    from conformance.suites._precompile_paths import resolve

    path, spec = resolve(path_name), model_spec(model_name)
    artifact, _record = ensure_built(ctx, path, spec)
    _LOADED_FOR_LATE_PEER[(path_name, model_name)] = (spec.build(ctx), spec.example(ctx),
                                                      _load(ctx, path, spec, artifact))
    _late_peer_signal(ctx, path_name, model_name).unlink(missing_ok=True)
    _barrier(ctx)


def _late_peer_signal(ctx, path_name: str, model_name: str) -> Path:
    return Path(ctx.shared_dir) / f"side-thread-ran-{_safe(path_name)}-{model_name}"


def late_peer_on_rank(ctx, path_name: str, model_name: str):
    """Rank 0 calls the loaded artifact while the last rank holds back its part of the collective
    until a side thread of rank 0 has run during that call (a file in the shared directory), or
    ``LATE_PEER_PATIENCE_S`` has passed. Rank 0 returns where its side thread found the call
    ("in-call": waiting on the peer; "after-call": it had returned, the collective not blocking the
    host); the last rank what it saw (None: nothing, the side thread never ran) and how long it waited."""
    import threading
    import time

    model, inputs, call = _LOADED_FOR_LATE_PEER.pop((path_name, model_name))
    signal = _late_peer_signal(ctx, path_name, model_name)
    # A pause without the GIL first, giving gloo's workers time to finish releasing the tensors of the
    # collectives before (they take the GIL for a Python-owned one, holding their queue's lock): a call
    # that keeps the GIL should meet the late peer, not that lock (the time-out above bounds it if not).
    time.sleep(WORKER_RELEASE_PAUSE_S)
    if ctx.rank == 0:
        entering, returned = threading.Event(), threading.Event()

        def side_thread():
            entering.wait()
            time.sleep(SIDE_THREAD_DELAY_S)
            signal.write_text("after-call" if returned.is_set() else "in-call")

        thread = threading.Thread(target=side_thread, name="conformance-gil-probe", daemon=True)
        thread.start()
        entering.set()
        with _no_grad():
            call(model, *inputs)
        returned.set()
        thread.join()
        return {"side_thread": signal.read_text()}
    started, seen = time.monotonic(), None
    if ctx.is_last:
        while seen is None and time.monotonic() - started < LATE_PEER_PATIENCE_S:
            seen = signal.read_text() if signal.exists() else None
            if seen is None:
                time.sleep(0.01)
    held_back = round(time.monotonic() - started, 2)
    with _no_grad():
        call(model, *inputs)
    return {"seen": seen, "held_back_s": held_back}


def check_collective_wait_releases_gil(ranks, path_name: str, model_name: str = "allreduce") -> dict:
    """A rank inside a loaded artifact whose collective waits for a late peer lets its other threads
    run: holding the GIL there deadlocks any thread the collective needs that takes it (gloo's worker
    releasing a Python-owned tensor under its queue lock does). Returns rank 0's finding."""
    ranks.run(prepare_late_peer_on_rank, path_name, model_name)
    results = ranks.run_with_timeout(LATE_PEER_CALL_TIMEOUT_S, late_peer_on_rank, path_name, model_name)
    last = results[-1]
    if last["seen"] is None:
        raise ConformanceFailure(
            f"rank 0's call into the {path_name} artifact of {model_name} held the GIL while its collective "
            f"waited for rank {len(results) - 1}: a Python thread of rank 0 did not run in "
            f"{last['held_back_s']} s (rank {len(results) - 1} held back its part until it did). A thread that "
            "needs the GIL for the collective to finish (gloo's worker releasing a Python-owned tensor) then "
            "deadlocks the rank")
    return {"side_thread": results[0]["side_thread"], "held_back_s": last["held_back_s"]}


def _compiled_at_load(counters: dict, traces_on_load: bool) -> str | None:
    """What the counters say was compiled at load or first call, or None. ``traces_on_load``: the
    path may trace with Dynamo then (a warm start), as long as Inductor only hits its caches."""
    if counters["inductor_cache_misses"]:
        return f"Inductor compiled {counters['inductor_cache_misses']} graph(s) (FX graph cache misses)"
    if not traces_on_load and (counters["dynamo_calls_captured"] or counters["dynamo_graphs"]):
        return (f"Dynamo traced {counters['dynamo_graphs']} graph(s) ({counters['dynamo_calls_captured']} "
                "calls captured)")
    if traces_on_load and not counters["inductor_cache_hits"]:
        return "the first call compiled without a single hit in the loaded caches"
    return None


def check_load(ranks, path_name: str, model_name: str) -> dict:
    """Rank 0 builds, every rank loads: no compilation, same bits everywhere and as rank 0's JIT,
    close to eager. Returns rank 0's build record."""
    from conformance.suites._precompile_paths import resolve

    path = resolve(path_name)
    what = f"{path_name} artifact of {model_name}"
    references = ranks.run(reference_on_rank, model_name)
    results = ranks.run(load_on_rank, path_name, model_name)
    problems = []
    for rank, res in enumerate(results):
        compiled = _compiled_at_load(res["counters"], path.traces_on_load)
        if compiled:
            problems.append(f"rank {rank}: load and first call of the {what} compiled: {compiled}; "
                            f"counters {res['counters']}")
    for rank, res in enumerate(results):
        if len(set(res["hashes"])) != 1:
            odd = [r for r, h in enumerate(res["hashes"]) if h != res["hashes"][0]]
            problems.append(f"rank {rank}: output hashes gathered over the process group differ: rank(s) "
                            f"{odd} disagree with rank 0 ({res['hashes']})")
            break
    jit = references[0]["jit"]
    for rank, res in enumerate(results):
        for expected, exact, label in ((jit, True, "rank 0's JIT-compiled output (bitwise)"),
                                       (references[rank]["eager"], False, "eager (within tolerance)")):
            try:
                assert_close(res["out"], expected, exact=exact, rank=rank, what=f"{what} against {label}")
            except ConformanceFailure as exc:
                problems.append(str(exc))
    if problems:
        raise ConformanceFailure(f"{what} on {ranks.world_size} ranks:\n" + "\n".join(problems))
    return results[0]["record"]


def check_determinism(ranks, path_name: str, model_name: str) -> dict:
    """Two cold builds share a build key; a byte-deterministic form also shares its bytes.
    Returns what was compared (for the report: which forms are byte-identical here)."""
    from conformance.suites._precompile_paths import resolve

    path = resolve(path_name)
    builds = ranks.run(rebuild_on_rank, path_name, model_name)[0]
    first, second = builds["first"], builds["second"]
    summary = {"path": path_name, "model": model_name, "byte_identical": first["sha256"] == second["sha256"],
               "key_identical": first["key"] == second["key"], "bytes": first["bytes"]}
    what = f"two builds of the {path_name} artifact of {model_name}"
    if not summary["key_identical"]:
        raise ConformanceFailure(f"{what} differ in their build key (graph-level fingerprint): "
                                 f"{first['key'][:64]} vs {second['key'][:64]}")
    if path.byte_deterministic and not summary["byte_identical"]:
        raise ConformanceFailure(f"{what} are not byte-identical: sha256 {first['sha256'][:16]} "
                                 f"({first['bytes']} bytes) vs {second['sha256'][:16]} ({second['bytes']} bytes)")
    return summary


def _is_clear(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in CLEAR_ERROR_WORDS)


def check_out_of_spec(ranks, path_name: str, model_name: str, cases: dict[str, str]) -> None:
    """``cases``: input description -> "works" (the dynamic dims allow it: it must run and match
    eager) or "works or raises" (it may refuse, clearly). Where eager raises the artifact must raise
    too. Never a recompilation."""
    from conformance.suites._precompile_paths import resolve

    path = resolve(path_name)
    results = ranks.run(out_of_spec_on_rank, path_name, model_name, list(cases))
    problems = []
    for rank, outcome in enumerate(results):
        for case, res in outcome.items():
            where = f"rank {rank}: {model_name} {path_name} artifact called with {case}"
            # After the first call every path must run without tracing: a warm start traced already.
            compiled = _compiled_at_load(res["counters"], traces_on_load=False)
            if compiled:
                problems.append(f"{where}: it recompiled: {compiled}")
                continue
            if res["error"] and "recompile" in res["error"].lower() and not path.traces_on_load:
                # Only a torch.compile'd function can trip the stance: this artifact fell back to one.
                problems.append(f"{where}: it tried to recompile (stopped by the fail_on_recompile stance): "
                                f"{res['error'][:300]}")
                continue
            if res["eager_error"] is not None:
                if res["error"] is None:
                    problems.append(f"{where}: returned a result where eager raises ({res['eager_error']})")
                elif not _is_clear(res["error"]):
                    problems.append(f"{where}: the error does not say what is wrong: {res['error']}")
            elif res["error"] is not None:
                if cases[case] == "works":
                    problems.append(f"{where}: raised although its dynamic dimensions allow it: {res['error']}")
                elif not _is_clear(res["error"]):
                    problems.append(f"{where}: the error does not say what is wrong: {res['error']}")
            else:
                try:
                    assert_close(res["out"], res["eager"], rank=rank, what=f"{where}: output against eager")
                except ConformanceFailure as exc:
                    problems.append(str(exc))
    if problems:
        raise ConformanceFailure("\n".join(problems))


def check_divergent(ranks, path_name: str, model_name: str = "mlp", rows: int = 6, views: bool = False) -> None:
    from conformance.suites._precompile_paths import resolve

    path = resolve(path_name)
    results = ranks.run(divergent_on_rank, path_name, model_name, rows, views)
    by_rank0 = results[0]["by_rank0"]
    problems = []
    for rank, res in enumerate(results):
        where = (f"rank {rank} ({res['rows']} rows{', a view of the global batch' if views else ''}) running the "
                 f"dynamic-batch {path_name} artifact of {model_name}")
        compiled = _compiled_at_load(res["counters"], path.traces_on_load)
        if compiled:
            problems.append(f"{where}: it compiled: {compiled}")
        for expected, exact, label in ((by_rank0[rank], True, "rank 0's run of the same rows (bitwise)"),
                                       (res["eager"], False, "eager (within tolerance)")):
            try:
                assert_close(res["out"], expected, exact=exact, rank=rank, what=f"{where} against {label}")
            except ConformanceFailure as exc:
                problems.append(str(exc))
    if problems:
        raise ConformanceFailure("\n".join(problems))
