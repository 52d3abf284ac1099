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
from typing import Literal

from conformance.capabilities import CapabilityReport, probe_capabilities, rank_probed
from conformance.descriptors import BackendDescriptor, DescriptorError, load_descriptors
from conformance.detect import absent_accelerator_note, resolve_backend
from conformance.report import (BackendInfo, CapabilityStatus, ConformanceReport, HostInfo, RankOutcome,
                                TestResult, TorchInfo, summarize)

__all__ = ["ConformanceSession", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    backend: str = "auto"
    world_size: int | None = None
    # The most ranks a @world_size(n) test may get, in a pool of its own: a number, "all" (any number on
    # CPU, the device count on an accelerator) or None (the world size: one pool for the run).
    max_ranks: int | Literal["all"] | None = None
    backends_dir: str | None = None
    rank_timeout: float = 300.0
    shared_dir: str | None = None  # a directory every rank sees (--shared-dir); None: chosen per host


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver(descriptor: BackendDescriptor) -> str | None:
    """The accelerator driver's version, from its command-line tool (not through a device context)."""
    import torch

    if descriptor.device_type != "cuda":
        return None
    tool = ["rocm-smi", "--showdriverversion"] if torch.version.hip else \
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        return subprocess.run(tool, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


@dataclass
class ConformanceSession:
    options: RunOptions
    descriptor: BackendDescriptor
    capabilities: CapabilityReport
    world_size: int
    available_ranks: int
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    pools: dict[int, object] = field(default_factory=dict)
    extra_events: list[str] = field(default_factory=list)

    launcher: object = None  # a conformance.ranks.launcher.LauncherWorld when started by torchrun
    terminated: str | None = None  # why, once the launcher has sent SIGTERM to this process
    finishing: bool = False  # the session's end has begun: a SIGTERM then only shortens the waits
    lost_ranks: list[int] = field(default_factory=list)  # rank 0: ranks that never reported their verdicts
    followers_failed: bool = False  # rank 0: another rank's own session failed (usage error, crash)
    detection_note: str | None = None  # why a detected backend is not the one torch was built for
    rank_imports: tuple[str, ...] = ()  # what the selected tests' ranks will import (capabilities.rank_imports)

    @classmethod
    def create(cls, options: RunOptions) -> "ConformanceSession":
        from conformance.ranks import fork_server_here
        from conformance.ranks.launcher import LauncherWorld

        descriptors = load_descriptors(options.backends_dir)
        descriptor = resolve_backend(options.backend, descriptors)
        fork_server_here(descriptor.device_type)  # before this process starts a thread (the stores, the probes)
        # The device-touching probes run on the ranks of the default pool (this process touches no device), and
        # so do those of what the selected tests' ranks import anyway (``expect_rank_imports``).
        made: list[ConformanceSession] = []  # the session, once made: the probes run after this method
        capabilities = probe_capabilities(
            descriptor, on_ranks=lambda: made[0].pool(made[0].world_size).probed_on_ranks(),
            rank_probed=lambda: rank_probed(made[0].rank_imports))
        launcher = LauncherWorld.from_env()
        if launcher is not None:
            if options.world_size and options.world_size != launcher.world_size:
                raise WorldSizeError(
                    f"--world-size {options.world_size} disagrees with the launcher's WORLD_SIZE {launcher.world_size}: "
                    "under torchrun the world is the launcher's (--nnodes x --nproc-per-node); leave --world-size out")
            world_size, ranks_here = launcher.world_size, launcher.local_world_size
            available = world_size  # a launcher's world cannot be resized within a run
        else:
            world_size = options.world_size or default_world_size(descriptor)
            ranks_here = world_size
            available = max(world_size, _available_ranks(options.max_ranks, descriptor, world_size))
        check_devices(descriptor, ranks_here, _device_count(descriptor))
        if available > ranks_here:
            check_devices(descriptor, available, _device_count(descriptor), option="--max-ranks")
        note = absent_accelerator_note() if options.backend == "auto" else None
        if note is not None:
            note += f", so it runs {descriptor.name} over {descriptor.distributed_backend}"
        session = cls(options=options, descriptor=descriptor, capabilities=capabilities, world_size=world_size,
                      available_ranks=available, launcher=launcher, detection_note=note)
        made.append(session)
        return session

    # -- pools ------------------------------------------------------------------------------------
    def expect_rank_imports(self, modules: tuple[str, ...]) -> None:
        """The selected tests' ranks will import ``modules`` (``capabilities.rank_imports``): every rank forked
        from now on is forked with them imported. A pool started before collection (for the header's device
        probes) keeps its first ranks as they are."""
        self.rank_imports = tuple(modules)
        for pool in self.pools.values():
            pool.rank_imports = self.rank_imports

    def pool(self, world_size: int):
        from conformance.ranks import RankPool
        from conformance.ranks.launcher import LauncherPool

        pool = self.pools.get(world_size)
        if pool is None:
            d = self.descriptor
            common = dict(descriptor=d.name, device_type=d.device_type, backend=d.distributed_backend,
                          setup_modules=d.setup_modules, timeout=self.options.rank_timeout,
                          symmetric_memory_backend=d.symmetric_memory_backend, rank_imports=self.rank_imports)
            if self.launcher is not None:
                if world_size != self.launcher.world_size:
                    raise ValueError(f"under a launcher the only pool is its world of {self.launcher.world_size} ranks")
                pool = LauncherPool(world=self.launcher, shared_root=self.options.shared_dir, **common)
            else:
                pool = RankPool(world_size=world_size, workdir=self.options.shared_dir, **common)
            self.pools[world_size] = pool
        return pool

    def shared_dir_missing(self) -> str | None:
        """Why the ranks' ``ctx.shared_dir`` is not one directory for all of them, or None when it is: on one
        host it always is; across hosts only with --shared-dir."""
        world = self.launcher
        if world is None or world.world_size <= world.local_world_size or self.options.shared_dir:
            return None
        return (f"needs a directory every rank sees; this run spans {world.world_size // world.local_world_size} "
                "nodes and ctx.shared_dir is per node: pass --shared-dir on a file system every node mounts "
                "(NFS, Lustre; see docs/running-at-scale.md)")

    @property
    def events(self) -> list[str]:
        return [f"{p.world_size} ranks: {e}" for p in self.pools.values() for e in p.events] + self.extra_events

    def close(self) -> None:
        """Stop every pool's ranks; the pools (and their events) stay for the report. Idempotent."""
        for pool in self.pools.values():
            pool.close()

    # -- the end of a launcher's run ------------------------------------------------------------------
    def watch_for_termination(self) -> None:
        """Under a launcher: turn its SIGTERM (sent to every local worker when one of them fails) into
        an orderly end, so this process still publishes its verdicts and, on rank 0, writes the report."""
        import signal
        import threading

        if self.launcher is None or threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum, frame):
            if self.terminated:
                return
            self.terminated = (f"the launcher process of rank {self.launcher.rank} ({self.launcher.node}) was sent "
                               "SIGTERM: its launcher is ending the run (a local worker failed or was lost)")
            if not self.finishing:
                raise KeyboardInterrupt(self.terminated)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _end_timeout(self) -> float:
        """How long rank 0 waits for the others' verdicts: they are at most one call behind it, unless the
        launcher is tearing the run down (then only what fits before its SIGKILL)."""
        from conformance.ranks.launcher import peer_margin

        if self.terminated:
            return TERMINATED_GATHER
        timeout = self.options.rank_timeout
        pool = self.pools.get(self.launcher.world_size)
        return timeout + peer_margin(timeout) + (pool.grace if pool is not None else 0.0)

    def _run_end(self):
        from conformance.ranks.launcher import RunEnd

        world = self.launcher
        pool = self.pools.get(world.world_size)
        return RunEnd(world, pool._store() if pool is not None else world.connect_store(self.options.rank_timeout))

    def gather_results(self, mine: list[TestResult], exitstatus: int = 0) -> list[TestResult] | None:
        """Under a launcher: publish this rank's verdicts; on rank 0, merge every rank's into one result per
        test (its outcome the worst of the ranks', each rank's outcome and node listed), naming the ranks
        that did not report in ``events``. None elsewhere."""
        self.finishing = True
        world = self.launcher
        self._own_exitstatus = exitstatus
        try:
            end = self._run_end()
            end.publish({"node": world.node, "tests": [t.model_dump(mode="json") for t in mine],
                         "exitstatus": exitstatus, "terminated": bool(self.terminated)})
        except Exception as exc:  # noqa: BLE001 - the store has gone with its host: nothing to report to
            self.extra_events.append(f"rank {world.rank} could not publish its results: {exc}")
            print(f"conformance: {self.extra_events[-1]}", file=sys.stderr)
            self._end = None
            return None if world.rank != 0 else merge_rank_results({0: {"node": world.node, "tests": mine}})
        self._end = end
        if world.rank != 0:
            return None
        timeout = self._end_timeout()
        payloads, missing = end.gather(timeout)
        per_rank: dict[int, dict] = {0: {"node": world.node, "tests": mine}}
        for rank, data in payloads.items():
            per_rank[rank] = {"node": data["node"], "tests": [TestResult(**t) for t in data["tests"]]}
        self._acks_from = [r for r, data in payloads.items() if not data["terminated"]]
        self.lost_ranks = missing
        self.followers_failed = any(data["exitstatus"] not in (0, 1) for data in payloads.values())
        for rank in missing:
            self.extra_events.append(f"rank {rank} did not report its results within {timeout:g} s: its launcher "
                                     "process was lost (killed, or hung past the run's end)")
        if self.terminated:
            self.extra_events.append(self.terminated)
        return merge_rank_results(per_rank)

    def end_launcher_run(self, code: int) -> int:
        """The exit code of this launcher process. Rank 0 publishes ``code`` (the run's, after the report is
        written) and waits for the others to read it; they exit 0 once they have (rank 0's code carries
        their outcomes) and with their own code, or 1, if it never came."""
        end = getattr(self, "_end", None)
        own = getattr(self, "_own_exitstatus", code)
        if end is None:
            return code or 1
        if self.launcher.rank == 0:
            end.announce(code, [] if self.terminated else self._acks_from)
            return code
        if self.terminated:  # the launcher is tearing this node down: it will not wait for rank 0
            return own or 1
        got = end.await_code(self._end_timeout() + ACK_TIMEOUT_MARGIN)
        return 0 if got is not None else (own or 1)

    @property
    def torch_version(self) -> str:
        """The running torch's version, which known failures' ``torch`` bounds are evaluated against."""
        import torch

        return torch.__version__

    # -- header and report ------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        import torch

        d = self.descriptor
        lines = [
            f"conformance: backend {d.name} ({d.source}), device {d.device_type}, "
            f"distributed backend {d.distributed_backend}, torch {torch.__version__}, "
            f"world size {self.world_size} ({self._available_text()})",
        ]
        if self.detection_note:
            lines.append(f"conformance: {self.detection_note}")
        for name in CHEAP_PROBES:  # the rest (imports of DTensor, Dynamo) only when a selected test needs them
            # Under a launcher only rank 0 prints a header: a device probe here would start the world's ranks
            # from rank 0 alone, a collective the others never join (they probe as they collect).
            if self.launcher is None or name not in RANK_SIDE_PROBES:
                self.capabilities.probes[name]
        # Printed before collection when the run is clearly a conformance run: a ``?`` may be probed later,
        # when a selected test needs it (the run's summary and its report say what it found).
        lines.append("conformance: capabilities: "
                     + self.capabilities.summary("probed only if a selected test needs it"))
        for line in self.capabilities.mismatches(probed_only=True):
            lines.append(f"conformance: DECLARED/PROBED MISMATCH in {d.name}.yaml: {line}")
        bounded = [kf for kf in d.known_failures if kf.torch is not None]
        if bounded:
            outside = sum(not kf.applies_to_torch(self.torch_version) for kf in bounded)
            lines.append(f"conformance: known failures: {len(d.known_failures) - outside} of {len(d.known_failures)} "
                         f"entries apply to torch {self.torch_version} ({outside} bounded to other versions)")
        return lines

    def _available_text(self) -> str:
        if self.available_ranks == self.world_size:
            return "one pool; tests that need more ranks skip"
        if self.available_ranks >= UNBOUNDED_RANKS:
            return "tests that need more ranks get a pool of their size"
        return f"tests that need up to {self.available_ranks} ranks get a pool of their size"

    def build_report(self, tests: list[TestResult], extra_events: list[str] = ()) -> ConformanceReport:
        import torch

        d = self.descriptor
        gpu = next((p.device_name for p in self.pools.values() if p.device_name), None)
        driver = _driver(d)
        # What the run probed: the capabilities its selected tests needed (and the header's cheap ones). Probing
        # the rest here would import DTensor and Dynamo, and start ranks, for a report on tests that used none.
        probes = self.capabilities.probes
        caps = {name: CapabilityStatus(declared=d.declares(name), probed=probes[name].available,
                                       reason=probes[name].reason)
                for name in self.capabilities.probed}
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


_SEVERITY = ("error", "failed", "xpassed", "unexpected_pass", "passed", "xfailed", "skipped")


def merge_rank_results(per_rank: dict[int, dict]) -> list[TestResult]:
    """One TestResult per test from every rank's: the worst outcome (the first failing rank's message),
    the longest duration, and each rank's outcome and node."""
    by_test: dict[str, list[tuple[int, str, TestResult]]] = {}
    for rank in sorted(per_rank):
        for result in per_rank[rank]["tests"]:
            by_test.setdefault(result.nodeid, []).append((rank, per_rank[rank]["node"], result))
    merged = []
    for nodeid, entries in by_test.items():
        worst = min(entries, key=lambda e: (_SEVERITY.index(e[2].outcome), e[0]))[2]
        merged.append(TestResult(
            nodeid=nodeid, suite=worst.suite, outcome=worst.outcome, message=worst.message,
            known_failure=worst.known_failure, world_size=worst.world_size,
            duration=max(e[2].duration for e in entries),
            ranks=[RankOutcome(rank=r, node=node, outcome=t.outcome, message=t.message if t.outcome != "passed" else "")
                   for r, node, t in entries]))
    return merged


CHEAP_PROBES = ("collectives", "symmetric_memory", "put_signal", "bf16")
RANK_SIDE_PROBES = ("symmetric_memory", "put_signal", "bf16")  # answered by the ranks (put_signal needs symmetric memory's)
# Under a launcher's SIGTERM: how long rank 0 waits for the others' verdicts (torchrun sends SIGKILL 30 s after).
TERMINATED_GATHER = 5.0
# How much longer than rank 0's gathering the others wait for its exit code (it writes the report meanwhile).
ACK_TIMEOUT_MARGIN = 60.0


class WorldSizeError(DescriptorError):
    """The requested world cannot run on this machine; the message names both numbers and the fix."""


def _device_count(descriptor: BackendDescriptor) -> int | None:
    if descriptor.device_type == "cpu":
        return None
    import torch

    try:
        return torch.accelerator.device_count()
    except Exception:  # noqa: BLE001 - no runtime for the device: counted as none
        return 0


def default_world_size(descriptor: BackendDescriptor) -> int:
    """The descriptor's world size; ``devices``: this machine's device count (at least 1, so that a
    machine without one still gets the clear "needs N devices" refusal)."""
    if descriptor.world_size != "devices":
        return descriptor.world_size
    return max(_device_count(descriptor) or 0, 1)


def _available_ranks(max_ranks: int | str | None, descriptor: BackendDescriptor, world_size: int) -> int:
    """The largest pool ``--max-ranks`` allows: ``all`` is any number on CPU (ranks are processes) and
    the device count on an accelerator (one rank per device)."""
    if max_ranks is None:
        return world_size
    if max_ranks != "all":
        return int(max_ranks)
    count = _device_count(descriptor)
    return UNBOUNDED_RANKS if count is None else max(count, 1)


UNBOUNDED_RANKS = 1 << 16  # ``--max-ranks all`` on CPU: as many ranks as a test asks for


def check_devices(descriptor: BackendDescriptor, ranks_here: int, device_count: int | None,
                  option: str = "--world-size") -> None:
    """Refuse more ranks on this machine than it has devices (``None``: CPU, any number). NCCL and its
    peers put one rank per device; two ranks sharing one fail at the first collective, far from the cause."""
    if device_count is None or ranks_here <= device_count:
        return
    if device_count == 0:
        import torch

        raise WorldSizeError(
            f"backend {descriptor.name} runs one rank per {descriptor.device_type} device, and this machine has 0 "
            f"{descriptor.device_type} devices (torch {torch.__version__}; torch.accelerator finds none): run it "
            f"where {descriptor.device_type} devices are present, or leave --backend out to test what this machine "
            "has (CPU over gloo when it has no accelerator)")
    raise WorldSizeError(
        f"{ranks_here} ranks on this machine need {ranks_here} {descriptor.device_type} devices (one rank per device "
        f"for {descriptor.distributed_backend}), but it has {device_count}: pass {option} {device_count} or "
        f"fewer{', or start fewer processes per node' if option == '--world-size' else ''}")
