"""TEST DOUBLES: deliberately broken precompile paths, each a bug the precompile suite must catch.

Handed to the suite's bodies by import path (``"tests.conformance.suites.precompile_broken:RecompilingLoadPath"``);
the rank processes import this module themselves. Each wraps the real ``aot_compile`` path and
breaks one promise: load without compiling, same bits on every rank, reproducible builds, no
silent recompilation for inputs the artifact was not built for, and no GIL held while a collective waits.
"""

from __future__ import annotations

import time

from conformance.suites._precompile_paths import AotCompilePath

__all__ = ["GilHoldingCallPath", "RankPerturbedPath", "RecompilingLoadPath", "SilentFallbackPath",
           "TimestampedBuildPath"]


class RecompilingLoadPath(AotCompilePath):
    """Bug: "loading" ignores the artifact and JIT-compiles the function again."""

    name = "broken-recompiling-load"

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        return torch.compile(fn, fullgraph=True)


class RankPerturbedPath(AotCompilePath):
    """Bug: the last rank's output is off by one unit in the last place (as a rank-dependent kernel
    choice, or an artifact corrupted in transit to one rank, would make it)."""

    name = "broken-rank-perturbed"

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        call = super().load(ctx, fn, artifact, scratch, dynamic_batch)
        if ctx.rank != ctx.world_size - 1:
            return call

        def perturbed(model, *inputs):
            out = call(model, *inputs)
            return torch.nextafter(out, torch.full_like(out, float("inf")))
        return perturbed


_BUILD_STAMP = 0.0


def stamped_forward(model, x):
    """The model plus a build-time constant that Dynamo bakes into the compiled graph."""
    return model(x) + _BUILD_STAMP


class TimestampedBuildPath(AotCompilePath):
    """Bug: every build embeds the time it was built, so no two builds are the same."""

    name = "broken-timestamped-build"

    def build(self, fn, model, inputs, dynamic_batch, artifact, scratch):
        global _BUILD_STAMP
        _BUILD_STAMP = (time.time_ns() % 1_000_003) * 1e-12
        return super().build(stamped_forward, model, inputs, dynamic_batch, artifact, scratch)


class SilentFallbackPath(AotCompilePath):
    """Bug: when the artifact refuses an input, fall back to a fresh JIT compile without a word."""

    name = "broken-silent-fallback"

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        call = super().load(ctx, fn, artifact, scratch, dynamic_batch)
        fallback = torch.compile(fn, fullgraph=True)

        def forgiving(model, *inputs):
            try:
                return call(model, *inputs)
            except RuntimeError:
                return fallback(model, *inputs)
        return forgiving


class GilHoldingCallPath(AotCompilePath):
    """Bug: rank 0's call keeps the GIL while it waits, as a native binding that does not release it
    does while its collective waits for a late rank: here it blocks in C with the GIL held (a
    ``ctypes.PyDLL`` call) for longer than the late rank waits, then runs."""

    name = "broken-gil-holding-call"

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import ctypes

        from conformance.suites._precompile_bodies import LATE_PEER_PATIENCE_S

        call = super().load(ctx, fn, artifact, scratch, dynamic_batch)
        if ctx.rank != 0:
            return call

        def holding(model, *inputs):
            ctypes.PyDLL(None).usleep(int((LATE_PEER_PATIENCE_S + 0.5) * 1e6))
            return call(model, *inputs)
        return holding
