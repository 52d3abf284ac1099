"""Capability probes: what the local torch and hardware can really do, against what a descriptor declares.

Triggered once per session by the plugin (and by ``conformance backends``). Reads the descriptor and
the installed torch; writes nothing. Each probe returns whether the capability works here and, when it
does not, the exact reason (the error torch raised, verbatim where there is one), which becomes the
skip reason of every test that needs it.

The probes that touch a device (``DEVICE_PROBES``: an allocation, a kernel) run where the ranks run,
with the ranks' settings (their device, their symmetric-memory backend): each rank runs
``probes_on_rank`` as it starts and its controller reads rank 0's answer. A controller never opens a
device context itself (under torchrun, 8 controllers would each open one on device 0, and the
symmetric-memory probe would allocate with torch's default backend, not the ranks').

The probes that only import (DTensor, Dynamo) run on rank 0 too when its ranks import those modules anyway
(``rank_probed``: the selected tests need them): there they cost nothing, while each controller (every xdist
worker, every launcher process under torchrun) would pay about a second and a half of CPU to import them for a
yes. A controller whose ranks do not answer one probes it itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.descriptors import BackendDescriptor

__all__ = ["DEVICE_PROBES", "RANK_IMPORTS", "CapabilityReport", "Probe", "probe_capabilities", "probes_on_rank",
           "rank_imports", "rank_probed"]

# Probed on a rank (see the module docstring); the others read only torch's Python and build.
DEVICE_PROBES = ("symmetric_memory", "bf16")

# What a rank imports to use a capability, where that costs a noticeable part of a second of CPU. A CPU pool's
# fork server imports these once, before it forks the ranks of a run whose selected tests need them, instead
# of every rank (and every rank of every respawn) importing them itself (``conformance.ranks.forkserver``).
# DTensor's ops enter ``torch._dynamo`` (their ``_disable_dynamo`` wrapper imports it on first use).
RANK_IMPORTS = {
    "dtensor": ("torch.distributed.tensor", "torch._dynamo"),
    "parallelisms": ("torch.distributed.tensor", "torch._dynamo"),
    "compile": ("torch._dynamo", "torch._inductor.compile_fx"),
    "aot_compile": ("torch._dynamo", "torch._inductor.compile_fx"),
}


def rank_imports(capabilities) -> tuple[str, ...]:
    """The modules of ``RANK_IMPORTS`` for ``capabilities``, each once, in a stable order."""
    return tuple(dict.fromkeys(module for capability in capabilities for module in RANK_IMPORTS.get(capability, ())))


def rank_probed(imported) -> tuple[str, ...]:
    """The capabilities besides ``DEVICE_PROBES`` that rank 0 probes for its controller, given the modules its
    ranks import anyway (``imported``, from ``rank_imports``): those whose every ``RANK_IMPORTS`` module is
    among them."""
    imported = set(imported)
    return tuple(c for c, modules in RANK_IMPORTS.items() if imported.issuperset(modules))


def _capabilities() -> tuple[str, ...]:
    # Imported here, not at the top: a rank imports this module for ``probes_on_rank`` alone, and the
    # descriptor schema (pydantic, yaml) would add a noticeable part of a second to every rank's start.
    from conformance.descriptors import CAPABILITIES

    return CAPABILITIES


@dataclass(frozen=True)
class Probe:
    capability: str
    available: bool
    reason: str = ""


class _LazyProbes(Mapping):
    """``{capability: Probe}``, each probe run the first time it is read: a run probes only what its
    selected tests need (``dtensor`` and ``compile`` import seconds of torch that a collectives run
    never uses)."""

    def __init__(self, descriptor: BackendDescriptor, on_ranks=None, rank_probed=tuple):
        self._descriptor = descriptor
        self._on_ranks = on_ranks
        self._rank_probed = rank_probed
        self._done: dict[str, Probe] = {}

    def __getitem__(self, capability: str) -> Probe:
        if capability not in self._done:
            if capability not in _PROBES:
                raise KeyError(capability)
            probe = None
            if self._on_ranks is not None and (capability in DEVICE_PROBES or capability in self._rank_probed()):
                probe = self._from_ranks(capability)
            self._done[capability] = probe or _PROBES[capability](self._descriptor, self)
        return self._done[capability]

    def _from_ranks(self, capability: str) -> Probe | None:
        """Rank 0's answer; None for a probe that touches no device and that the ranks did not answer (they
        started before the selected tests were known, or could not start): it runs here instead."""
        try:
            available, reason = self._on_ranks()[capability]
        except Exception as exc:  # noqa: BLE001 - the ranks could not start, or gave no answer to this probe
            if capability not in DEVICE_PROBES:
                return None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return Probe(capability, False, f"not probed: the ranks did not start ({first})")
        return Probe(capability, available, reason)

    def __iter__(self):
        return iter(_capabilities())

    def __len__(self) -> int:
        return len(_capabilities())

    @property
    def probed(self) -> list[str]:
        """The capabilities probed so far, in the canonical order."""
        return [c for c in _capabilities() if c in self._done]

    def adopt(self, probe: Probe) -> None:
        """Take a probe run by another process of this run (a pytest-xdist worker) as if run here; one
        run here already stands."""
        if probe.capability in _PROBES:
            self._done.setdefault(probe.capability, probe)


@dataclass
class CapabilityReport:
    """Declared and probed capabilities of one backend on this machine (probed lazily, once each)."""

    descriptor: BackendDescriptor
    probes: Mapping[str, Probe] = None  # type: ignore[assignment]
    on_ranks: object = None  # () -> {capability: (available, reason)}, as rank 0 found them
    rank_probed: object = tuple  # () -> the capabilities besides DEVICE_PROBES to ask the ranks (``rank_probed``)

    def __post_init__(self) -> None:
        if self.probes is None:
            self.probes = _LazyProbes(self.descriptor, self.on_ranks, self.rank_probed)

    def usable(self, capability: str) -> tuple[bool, str]:
        """(True, "") when declared and probed; else (False, why) naming the descriptor or the probe."""
        probe = self.probes[capability]
        if not self.descriptor.declares(capability):
            # Keep the probe's own reason (torch's words) in the skip reason: it says why, not just who.
            hint = (" (the probe finds it available: consider declaring it)" if probe.available
                    else f" (probe: {probe.reason})" if probe.reason else "")
            return False, f"{self.descriptor.name} declares {capability}: false in {self.descriptor.source}{hint}"
        if not probe.available:
            return False, f"{capability} unavailable on {self.descriptor.name}: {probe.reason}"
        return True, ""

    @property
    def probed(self) -> list[str]:
        """The capabilities probed so far, in the canonical order (all of them for probes given whole)."""
        return getattr(self.probes, "probed", list(_capabilities()))

    def adopt(self, probes) -> None:
        """Take probes run by other processes of this run (pytest-xdist workers: the controller collects
        nothing, so its report and summary would otherwise lack what only the workers' tests needed)."""
        if hasattr(self.probes, "adopt"):
            for probe in probes:
                self.probes.adopt(probe)

    def summary(self, unprobed: str) -> str:
        """``name=yes|no|?`` for every capability (usable here, or not; ``?``: not probed), followed by
        ``(?: unprobed)`` when any is not probed."""
        probed = set(self.probed)
        shown = " ".join(f"{name}={('yes' if self.usable(name)[0] else 'no') if name in probed else '?'}"
                         for name in _capabilities())
        return shown + (f" (?: {unprobed})" if len(probed) < len(_capabilities()) else "")

    def mismatches(self, probed_only: bool = False) -> list[str]:
        """One line per capability whose declaration and probe disagree (``probed_only``: among those
        probed so far, probing nothing more)."""
        lines = []
        names = self.probed if probed_only else _capabilities()
        for name in names:
            declared, probe = self.descriptor.declares(name), self.probes[name]
            if declared and not probe.available:
                lines.append(f"{name}: declared true but the probe fails: {probe.reason}")
            elif not declared and probe.available:
                lines.append(f"{name}: declared false but the probe finds it available")
        return lines


def _device(descriptor: BackendDescriptor):
    import torch

    return torch.device(descriptor.device_type, 0) if descriptor.device_type != "cpu" else torch.device("cpu")


def _probe_collectives(d: BackendDescriptor) -> Probe:
    import torch.distributed as dist

    if not dist.is_available():
        return Probe("collectives", False, "torch.distributed is not available in this build")
    name = d.distributed_backend
    registered = name in dist.Backend.backend_list or name.upper() in dist.Backend.backend_type_map
    if not registered:
        return Probe("collectives", False, f"distributed backend {name!r} is not registered "
                     "(import the module that registers it via setup_modules)")
    if not dist.is_backend_available(name):
        return Probe("collectives", False, f"distributed backend {name!r} is not available in this build")
    return Probe("collectives", True)


def _probe_dtensor(d: BackendDescriptor) -> Probe:
    try:
        import torch.distributed.tensor  # noqa: F401
    except Exception as exc:  # an import error of any kind means no DTensor
        return Probe("dtensor", False, f"import torch.distributed.tensor failed: {exc}")
    return Probe("dtensor", True)


def _probe_compile(d: BackendDescriptor) -> Probe:
    import torch

    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return Probe("compile", False, "torch._dynamo is not supported on this Python")
    except Exception as exc:
        return Probe("compile", False, f"torch._dynamo unavailable: {exc}")
    if d.device_type == "cpu":
        if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
            return Probe("compile", False, "Inductor on CPU needs a C++ compiler; none found on PATH")
    elif d.device_type in ("cuda", "xpu"):
        from torch.utils._triton import has_triton

        if not has_triton():
            return Probe("compile", False, f"Inductor on {d.device_type} needs triton; it is not installed")
    return Probe("compile", True)


def _probe_aot_compile(d: BackendDescriptor, compile_probe: Probe) -> Probe:
    import torch

    if not compile_probe.available:
        return Probe("aot_compile", False, f"needs compile: {compile_probe.reason}")
    if not hasattr(torch.compiler, "load_compiled_function"):
        return Probe("aot_compile", False, "torch.compiler.load_compiled_function is missing in this torch")
    # The eager backend: the attribute is the same, and Inductor (seconds to import) stays unloaded.
    if not hasattr(torch.compile(lambda x: x, backend="eager"), "aot_compile"):
        return Probe("aot_compile", False, "torch.compile(...) has no aot_compile in this torch")
    return Probe("aot_compile", True)


def _probe_symmetric_memory(device) -> Probe:
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.empty(16, device=device)
    except Exception as exc:
        return Probe("symmetric_memory", False, str(exc).strip().splitlines()[0])
    return Probe("symmetric_memory", True)


def _nccl_version() -> tuple[int, ...] | None:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return tuple(version) if isinstance(version, tuple) else None


def _probe_put_signal(d: BackendDescriptor, symm: Probe) -> Probe:
    import torch.distributed._symmetric_memory as symm_mem

    if not symm.available:
        return Probe("put_signal", False, f"needs symmetric memory: {symm.reason}")
    if not hasattr(symm_mem, "put_signal"):
        return Probe("put_signal", False, "torch.distributed._symmetric_memory.put_signal is missing")
    if d.device_type == "cuda":
        version = _nccl_version()
        if version is None or version < (2, 29):
            shown = ".".join(map(str, version)) if version else "unknown"
            return Probe("put_signal", False,
                         f"put_signal dispatches to NCCL only and needs NCCL >= 2.29; this build has {shown}")
    return Probe("put_signal", True)


def _probe_bf16(device) -> Probe:
    import torch

    try:
        a = torch.ones(4, 4, dtype=torch.bfloat16, device=device)
        (a @ a).sum().item()
    except Exception as exc:
        return Probe("bf16", False, f"bfloat16 matmul failed: {exc}")
    return Probe("bf16", True)


def _probe_parallelisms(d: BackendDescriptor, collectives: Probe) -> Probe:
    if not collectives.available:
        return Probe("parallelisms", False, f"needs collectives: {collectives.reason}")
    try:
        import torch.distributed.pipelining  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.nn.parallel import DistributedDataParallel  # noqa: F401
    except Exception as exc:  # an import error of any kind: the parallelisms are not all there
        return Probe("parallelisms", False, f"importing DDP, FSDP2, tensor parallelism or pipelining failed: {exc}")
    return Probe("parallelisms", True)


_PROBES = {
    "collectives": lambda d, probes: _probe_collectives(d),
    "dtensor": lambda d, probes: _probe_dtensor(d),
    "compile": lambda d, probes: _probe_compile(d),
    "aot_compile": lambda d, probes: _probe_aot_compile(d, probes["compile"]),
    "symmetric_memory": lambda d, probes: _probe_symmetric_memory(_device(d)),
    "put_signal": lambda d, probes: _probe_put_signal(d, probes["symmetric_memory"]),
    "bf16": lambda d, probes: _probe_bf16(_device(d)),
    "parallelisms": lambda d, probes: _probe_parallelisms(d, probes["collectives"]),
}


@dataclass(frozen=True)
class _OnRank:
    """What the probes read of a descriptor, as a rank knows it (the rank has no descriptor object)."""

    device_type: str
    distributed_backend: str


def probes_on_rank(device, distributed_backend: str, also=()) -> dict[str, tuple[bool, str]]:
    """On a rank, with its device selected: ``{capability: (available, reason)}`` for ``DEVICE_PROBES`` and
    for the capabilities in ``also`` (``rank_probed``: what this rank has imported anyway)."""
    probes = {"symmetric_memory": _probe_symmetric_memory(device), "bf16": _probe_bf16(device)}
    here = _LazyProbes(_OnRank(device.type, distributed_backend))
    for capability in also:
        try:
            probes[capability] = here[capability]
        except Exception:  # noqa: BLE001 - not answered: the controller probes it, as it would have, not the rank's start
            pass
    return {name: (probe.available, probe.reason) for name, probe in probes.items()}


def probe_capabilities(descriptor: BackendDescriptor, on_ranks=None, rank_probed=tuple) -> CapabilityReport:
    """probe_capabilities(descriptor, on_ranks=None, rank_probed=tuple) -> CapabilityReport whose probes run
    when first read: ``DEVICE_PROBES`` and those ``rank_probed()`` names on the ranks (``on_ranks()`` gives
    rank 0's answers), the rest (all of them without ``on_ranks``) in this process."""
    return CapabilityReport(descriptor, on_ranks=on_ranks, rank_probed=rank_probed)
