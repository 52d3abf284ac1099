"""One conformance run: the chosen backend, its probed capabilities, its rank pools and its results.

Created by the plugin the first time a session collects a conformance test (so a pytest run of
unrelated tests never imports torch). Reads descriptors and the machine; owns the rank pools (one per
world size, started lazily, closed at the end) and assembles the JSON report.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from conformance.capabilities import CapabilityReport, probe_capabilities
from conformance.descriptors import BackendDescriptor, load_descriptors
from conformance.detect import resolve_backend
from conformance.report import (BackendInfo, CapabilityStatus, ConformanceReport, HostInfo, TestResult,
                                TorchInfo, summarize)

__all__ = ["ConformanceSession", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    backend: str = "auto"
    world_size: int | None = None
    backends_dir: str | None = None
    rank_timeout: float = 300.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu(descriptor: BackendDescriptor) -> tuple[str | None, str | None]:
    import torch

    if descriptor.device_type == "cpu":
        return None, None
    try:
        name = torch.accelerator.get_device_name(0) if hasattr(torch.accelerator, "get_device_name") \
            else torch.cuda.get_device_name(0)
    except Exception:
        name = None
    driver = None
    if descriptor.device_type == "cuda":
        tool = ["rocm-smi", "--showdriverversion"] if torch.version.hip else \
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            driver = subprocess.run(tool, capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            driver = None
    return name, driver


@dataclass
class ConformanceSession:
    options: RunOptions
    descriptor: BackendDescriptor
    capabilities: CapabilityReport
    world_size: int
    available_ranks: int
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    pools: dict[int, object] = field(default_factory=dict)

    @classmethod
    def create(cls, options: RunOptions) -> "ConformanceSession":
        descriptors = load_descriptors(options.backends_dir)
        descriptor = resolve_backend(options.backend, descriptors)
        capabilities = probe_capabilities(descriptor)
        world_size = options.world_size or descriptor.world_size
        return cls(options=options, descriptor=descriptor, capabilities=capabilities,
                   world_size=world_size, available_ranks=_available_ranks(descriptor, world_size))

    # -- pools ------------------------------------------------------------------------------------
    def pool(self, world_size: int):
        from conformance.ranks import RankPool

        pool = self.pools.get(world_size)
        if pool is None:
            d = self.descriptor
            pool = RankPool(descriptor=d.name, device_type=d.device_type, backend=d.distributed_backend,
                            world_size=world_size, setup_modules=d.setup_modules,
                            timeout=self.options.rank_timeout,
                            symmetric_memory_backend=d.symmetric_memory_backend)
            self.pools[world_size] = pool
        return pool

    @property
    def events(self) -> list[str]:
        return [f"{p.world_size} ranks: {e}" for p in self.pools.values() for e in p.events]

    def close(self) -> None:
        """Stop every pool's ranks; the pools (and their events) stay for the report. Idempotent."""
        for pool in self.pools.values():
            pool.close()

    # -- header and report ------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        import torch

        d = self.descriptor
        lines = [
            f"conformance: backend {d.name} ({d.source}), device {d.device_type}, "
            f"distributed backend {d.distributed_backend}, torch {torch.__version__}, "
            f"world size {self.world_size} (ranks available: {self.available_ranks})",
        ]
        usable = (f"{name}={'yes' if self.capabilities.usable(name)[0] else 'no'}"
                  for name in self.capabilities.probes)
        lines.append("conformance: capabilities: " + " ".join(usable))
        for line in self.capabilities.mismatches():
            lines.append(f"conformance: DECLARED/PROBED MISMATCH in {d.name}.yaml: {line}")
        return lines

    def build_report(self, tests: list[TestResult], extra_events: list[str] = ()) -> ConformanceReport:
        import torch

        d = self.descriptor
        gpu, driver = _gpu(d)
        caps = {name: CapabilityStatus(declared=d.declares(name), probed=p.available, reason=p.reason)
                for name, p in self.capabilities.probes.items()}
        return ConformanceReport(
            backend=BackendInfo(name=d.name, device_type=d.device_type,
                                distributed_backend=d.distributed_backend, world_size=self.world_size,
                                capabilities=caps),
            torch=TorchInfo(version=torch.__version__, git_version=getattr(torch.version, "git_version", "")),
            host=HostInfo(python=sys.version.split()[0], platform=platform.platform(), cpu=_cpu_model(),
                          gpu=gpu, driver=driver),
            started_at=self.started_at, finished_at=datetime.now(timezone.utc),
            summary=summarize(tests), tests=tests, events=self.events + list(extra_events),
        )


def _available_ranks(descriptor: BackendDescriptor, world_size: int) -> int:
    """Ranks a test may use: the run's world size, capped by the device count on accelerators."""
    if descriptor.device_type == "cpu":
        return world_size
    import torch

    try:
        count = torch.accelerator.device_count()
    except Exception:
        count = 0
    return min(world_size, count) if count else world_size
