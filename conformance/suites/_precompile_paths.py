"""The ways torch can compile once and run elsewhere, behind one seam: a name -> ``PrecompilePath``.

Rank functions of ``test_precompile`` take a path name and resolve it on the rank. Built-in names:

* ``precompile``: ``torch.compiler.precompile`` (newer than torch 2.13; detected, never assumed);
* ``aot_compile``: ``torch.compile(fn, fullgraph=True).aot_compile(...)`` + ``save_compiled_function``,
  loaded with ``torch.compiler.load_compiled_function`` (no Dynamo trace at load);
* ``megacache``: ``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``: a warm start,
  so Dynamo still traces at first call, but Inductor must compile nothing (every lookup a hit);
* ``aoti``: ``torch.export`` + ``torch._inductor.aoti_compile_and_package`` / ``aoti_load_package``.

Any other name is an import path ``"package.module:ATTRIBUTE"`` to a ``PrecompilePath`` class,
which the rank processes import themselves: the project's own tests hand the suite a path that
recompiles at load, one whose output differs on one rank, and one whose build is not reproducible.

A path's ``build`` writes the artifact and a ``<artifact>.json`` sidecar holding its build key (a
graph-level fingerprint that two builds of the same model must share even when the bytes differ)
and its SHA-256; ``load`` returns ``call(model, *inputs)``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["AotCompilePath", "AotInductorPath", "MegaCachePath", "PrecompilePath", "TorchPrecompilePath",
           "resolve", "sha256_of"]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# Comment lines of generated code that differ between identical builds: local paths, and the AOT
# graph counter of the process that compiled.
_VOLATILE_COMMENTS = ("# kernel path", "// kernel path", "# AOT ID")


def _code_key(codes) -> str:
    """Fingerprint of Inductor's generated code, without the comment lines that vary per process."""
    digest = hashlib.sha256()
    for code in codes:
        for line in code.splitlines():
            if not line.lstrip().startswith(_VOLATILE_COMMENTS):
                digest.update(line.encode() + b"\n")
    return digest.hexdigest()


@contextmanager
def inductor_cache_dir(path: Path):
    """Point Inductor (and everything it caches) at ``path`` for a while; restore afterwards."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _mark_dynamic_batch(inputs, dynamic_batch: bool):
    import torch

    if dynamic_batch:
        torch._dynamo.mark_dynamic(inputs[0], 0)
    return inputs


class PrecompilePath:
    """One way to compile ahead of time. Subclasses set the class attributes and implement
    ``build`` and ``load``.

    Attributes: ``name``; ``traces_on_load`` (True when Dynamo re-traces at first call by design,
    as for a cache warm start); ``build_runs_model`` (the build calls the model, as a JIT compile
    does: a model with a collective then needs every rank in the build); ``byte_deterministic`` (two
    cold builds must give the same bytes, not just the same build key); ``suffix`` of the artifact file.
    """

    name = "?"
    traces_on_load = False
    build_runs_model = True
    byte_deterministic = False
    suffix = ".bin"

    def unavailable_reason(self) -> str | None:
        """None when this torch offers the path, else why not (becomes the skip reason)."""
        return None

    def build(self, fn, model, inputs: tuple, dynamic_batch: bool, artifact: Path, scratch: Path) -> str:
        """Compile ``fn(model, *inputs)`` and write ``artifact``; return the build key."""
        raise NotImplementedError

    def load(self, ctx, fn, artifact: Path, scratch: Path, dynamic_batch: bool):
        """Return ``call(model, *inputs)`` running the artifact with no compilation."""
        raise NotImplementedError

    # -- shared by every path --------------------------------------------------------------------
    def build_to(self, fn, model, inputs, dynamic_batch: bool, artifact: Path, scratch: Path) -> dict:
        artifact.parent.mkdir(parents=True, exist_ok=True)
        key = self.build(fn, model, inputs, dynamic_batch, artifact, scratch)
        record = {"path": self.name, "key": key, "sha256": sha256_of(artifact),
                  "bytes": artifact.stat().st_size}
        Path(str(artifact) + ".json").write_text(json.dumps(record))
        return record


class TorchPrecompilePath(PrecompilePath):
    """``torch.compiler.precompile``: not in torch 2.13. Detected; this suite does not drive it yet."""

    name = "precompile"

    def unavailable_reason(self):
        import torch

        if not hasattr(torch.compiler, "precompile"):
            return f"torch.compiler.precompile is not in torch {torch.__version__}"
        return (f"torch.compiler.precompile exists in torch {torch.__version__} but this suite has no "
                "PrecompilePath for it yet: add one in conformance/suites/_precompile_paths.py")


class AotCompilePath(PrecompilePath):
    name = "aot_compile"

    def unavailable_reason(self):
        import torch

        if not hasattr(torch.compiler, "load_compiled_function"):
            return f"torch.compiler.load_compiled_function is not in torch {torch.__version__}"
        if not hasattr(torch.compile(lambda x: x), "aot_compile"):
            return f"torch.compile(...).aot_compile is not in torch {torch.__version__}"
        return None

    def build(self, fn, model, inputs, dynamic_batch, artifact, scratch):
        import torch
        from torch._inductor.utils import run_and_get_code

        inputs = _mark_dynamic_batch(inputs, dynamic_batch)
        compiled, codes = run_and_get_code(
            lambda: torch.compile(fn, fullgraph=True).aot_compile(((model, *inputs), {})))
        compiled.save_compiled_function(str(artifact))
        return _code_key(codes)

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        with open(artifact, "rb") as f:
            return torch.compiler.load_compiled_function(f)


class MegaCachePath(PrecompilePath):
    """The caches of a JIT compile, shipped as bytes and loaded into a rank's own, empty cache
    directory (so a hit can only come from the artifact, not from what this machine compiled)."""

    name = "megacache"
    traces_on_load = True

    def unavailable_reason(self):
        import torch

        for attr in ("save_cache_artifacts", "load_cache_artifacts"):
            if not hasattr(torch.compiler, attr):
                return f"torch.compiler.{attr} is not in torch {torch.__version__}"
        return None

    def build(self, fn, model, inputs, dynamic_batch, artifact, scratch):
        import torch
        from torch.compiler._cache import CacheArtifactManager

        torch._dynamo.reset()
        CacheArtifactManager.clear()
        torch.compile(fn, fullgraph=True)(model, *_mark_dynamic_batch(inputs, dynamic_batch))
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RuntimeError("torch.compiler.save_cache_artifacts() returned None after a compile: "
                               "the compile recorded no cache artifacts (are the Inductor caches disabled?)")
        data, info = saved
        artifact.write_bytes(data)
        return json.dumps(sorted(info.artifacts.get("inductor", [])))

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        torch._dynamo.reset()
        cache = scratch / f"cache-rank{ctx.rank}"
        compiled = torch.compile(fn, fullgraph=True)
        state = {"first": True}

        def call(model, *inputs):
            if not state["first"]:
                return compiled(model, *inputs)
            # The first call compiles from the loaded caches, in a cache directory that holds
            # nothing else; later calls reuse the compiled code.
            state["first"] = False
            with inductor_cache_dir(cache):
                torch.compiler.load_cache_artifacts(artifact.read_bytes())
                return compiled(model, *_mark_dynamic_batch(inputs, dynamic_batch))
        return call


class AotInductorPath(PrecompilePath):
    """AOTInductor packages weights and code into one ``.pt2``. Its runtime checks inputs only when
    ``AOTI_RUNTIME_CHECK_INPUTS=1`` (read once per loaded library), so the loader sets it. The
    package records the compile commands, which name the Inductor cache directory, and a source
    file already in that directory changes what gets recorded: byte-identical packages need cold
    builds in the same directory path."""

    name = "aoti"
    build_runs_model = False  # export traces with fake tensors, and Inductor compiles what it traced
    byte_deterministic = True
    suffix = ".pt2"

    def unavailable_reason(self):
        import torch

        try:
            import torch._inductor  # noqa: F401
        except Exception as exc:
            return f"torch._inductor does not import: {exc}"
        for attr in ("aoti_compile_and_package", "aoti_load_package"):
            if not hasattr(torch._inductor, attr):
                return f"torch._inductor.{attr} is not in torch {torch.__version__}"
        return None

    def build(self, fn, model, inputs, dynamic_batch, artifact, scratch):
        import torch

        dynamic = None
        if dynamic_batch:
            dynamic = ({0: torch.export.Dim("batch", min=2, max=1024)},) + (None,) * (len(inputs) - 1)
        exported = torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic)
        torch._inductor.aoti_compile_and_package(exported, package_path=str(artifact))
        return sha256_of(artifact)

    def load(self, ctx, fn, artifact, scratch, dynamic_batch):
        import torch

        os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"
        index = ctx.device.index if ctx.device.index is not None else -1
        runner = torch._inductor.aoti_load_package(str(artifact), device_index=index)
        return lambda model, *inputs: runner(*inputs)


PATHS = {cls.name: cls for cls in (TorchPrecompilePath, AotCompilePath, MegaCachePath, AotInductorPath)}


def resolve(name: str) -> PrecompilePath:
    """resolve(name) -> PrecompilePath: a built-in name or ``"package.module:ATTRIBUTE"``."""
    if name in PATHS:
        return PATHS[name]()
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"precompile path {name!r}: expected one of {', '.join(PATHS)} or "
                         "'package.module:ATTRIBUTE' naming a PrecompilePath subclass")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, PrecompilePath)):
        raise TypeError(f"precompile path {name!r} is {cls!r}, not a PrecompilePath subclass")
    return cls()
