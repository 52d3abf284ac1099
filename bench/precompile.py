"""Benchmark: first-call time of a cold JIT compile against loading a precompiled artifact, per path.

Run: ``python bench/precompile.py [--model mlp|transformer] [--empty-cache]``. Reads nothing; writes
only a temporary directory, removed at the end. Every measurement runs in a fresh Python process with
its own Inductor cache directory, so no process benefits from another's work on the model. By
default each directory starts as a copy of one where Inductor compiled an unrelated function (a host
that has run Inductor before: its one-off CPU feature probing, about 10 s, is done); with
``--empty-cache`` each starts empty, as on a freshly started container.

1. a build process compiles the model once per available path (aot_compile, megacache, aoti) and
   records build times and artifact sizes;
2. ``jit``: a fresh process times ``torch.compile(fn, fullgraph=True)`` up to the end of its first call;
3. one fresh process per path times loading the artifact up to the end of its first call, and
   checks that the output equals the JIT's bit for bit.

Prints the figures, then one JSON line ``{"name", "figures", "ratio"}`` where ratio is the cold JIT
first call over the fastest artifact load-and-first-call (how many times faster a rank starts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("aot_compile", "megacache", "aoti")


class _Ctx:
    """The little of a RankContext the suite's model specs and paths read, for one process."""

    rank = 0
    world_size = 1

    def __init__(self, scratch: str):
        import torch

        self.device = torch.device("cpu")
        self.shared_dir = scratch
        self.group = None


def _model(name: str, scratch: str):
    from conformance.suites._precompile_models import model_spec

    spec, ctx = model_spec(name), _Ctx(scratch)
    if spec.collective:
        raise SystemExit(f"--model {name}: the benchmark runs one process; pick a model without a collective")
    return spec, ctx, spec.build(ctx), spec.example(ctx)


def child(args) -> dict:
    """Runs in a fresh process: build everything, or time one first call."""
    import torch

    from conformance.suites._precompile_models import forward
    from conformance.suites._precompile_paths import resolve

    spec, ctx, model, inputs = _model(args.model, args.workdir)
    work = Path(args.workdir)
    with torch.no_grad():
        if args.child == "warm":
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list

            valid_vec_isa_list()  # the CPU feature probe, which compiles one test program per ISA
            torch.compile(lambda t: t.sin() + 1, fullgraph=True)(torch.randn(8))
            return {}
        if args.child == "build":
            out = {}
            for name in PATHS:
                path = resolve(name)
                reason = path.unavailable_reason()
                if reason:
                    out[name] = {"skipped": reason}
                    continue
                torch._dynamo.reset()
                start = time.perf_counter()
                record = path.build_to(forward, model, inputs, False, work / name / f"{args.model}{path.suffix}",
                                       work / name / "scratch")
                out[name] = {"build_s": time.perf_counter() - start, "bytes": record["bytes"]}
            return out
        start = time.perf_counter()
        if args.child == "jit":
            result = torch.compile(forward, fullgraph=True)(model, *inputs)
        else:
            path = resolve(args.child)
            call = path.load(ctx, forward, work / args.child / f"{args.model}{path.suffix}",
                             work / args.child / "load", False)
            result = call(model, *inputs)
        elapsed = time.perf_counter() - start
        torch.save(result, work / f"out-{args.child}.pt")
        return {"first_call_s": elapsed}


def _spawn(mode: str, model: str, workdir: Path, cache: Path, template: Path | None = None) -> dict:
    if template is not None:
        shutil.copytree(template, cache)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model, "--workdir", str(workdir)],
                          env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench child {mode!r} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="model of the precompile suite (default mlp)")
    parser.add_argument("--empty-cache", action="store_true",
                        help="start every process with an empty Inductor cache directory (default: a warmed copy)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0

    import torch

    work = Path(tempfile.mkdtemp(prefix="bench-precompile-"))
    try:
        template = None
        if not args.empty_cache:
            template = work / "cache-warmed"
            _spawn("warm", args.model, work, template)
        built = _spawn("build", args.model, work, work / "cache-build", template)
        timings = {"jit": _spawn("jit", args.model, work, work / "cache-jit", template)["first_call_s"]}
        for name in PATHS:
            if "skipped" not in built[name]:
                if name == "megacache" and template is not None:
                    # Its loader switches to a cache directory of its own (see MegaCachePath): the same start.
                    shutil.copytree(template, work / name / "load" / "cache-rank0")
                timings[name] = _spawn(name, args.model, work, work / f"cache-{name}", template)["first_call_s"]
        reference = torch.load(work / "out-jit.pt")
        cache_state = "empty" if args.empty_cache else "warmed (Inductor ran before, never on this model)"
        figures = {"model": args.model, "cache_dir": "empty" if args.empty_cache else "warmed",
                   "jit_cold_first_call_s": round(timings["jit"], 3)}
        print(f"model {args.model}; every figure from a fresh process, Inductor cache directory {cache_state}")
        print(f"  cold JIT compile, first call: {timings['jit']:.2f} s")
        for name in PATHS:
            if "skipped" in built[name]:
                print(f"  {name}: skipped: {built[name]['skipped']}")
                continue
            same = torch.equal(torch.load(work / f"out-{name}.pt"), reference)
            figures.update({f"{name}_load_first_call_s": round(timings[name], 3),
                            f"{name}_build_s": round(built[name]["build_s"], 3),
                            f"{name}_artifact_bytes": built[name]["bytes"],
                            f"{name}_speedup": round(timings["jit"] / timings[name], 2),
                            f"{name}_bitwise_equal_to_jit": same})
            print(f"  {name}: load + first call {timings[name]:.2f} s ({timings['jit'] / timings[name]:.1f}x "
                  f"faster than cold JIT), build {built[name]['build_s']:.2f} s, artifact "
                  f"{built[name]['bytes'] / 1024:.0f} KiB, output bitwise equal to JIT: {same}")
        loads = [timings[n] for n in PATHS if n in timings]
        ratio = round(timings["jit"] / min(loads), 2) if loads else None
        print(json.dumps({"name": "precompile_first_call", "figures": figures, "ratio": ratio}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
