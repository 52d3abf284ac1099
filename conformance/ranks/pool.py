"""The controller of a persistent pool of N rank processes sharing one process group.

``RankPool.run(fn, *args, **kwargs)`` runs a module-level function on every rank and returns the
per-rank results in rank order. The pool starts lazily on the first call and stays up between calls
(about 10 ms a call instead of seconds for spawn-per-test). One thread owns all state: the caller's.

Failure is an event, not a catastrophe:

* a function raises on some ranks -> ``RankError`` with every failing rank's remote traceback; the
  process group is replaced by a fresh one (a group that has raised cannot be trusted); ranks that
  do not answer within ``grace`` seconds of the first failure are presumed stuck in a collective and
  the pool is respawned;
* a call exceeds its timeout -> ``RankTimeout`` naming the ranks that did not answer; pool respawned;
* a rank dies (segfault, ``os._exit``) -> ``RankCrashed`` naming the rank, the signal or exit code
  and its last output; pool respawned.

The next call then runs on a healthy pool. ``events`` records each of these for the run summary.
"""

from __future__ import annotations

import os
import selectors
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from conformance.capabilities import rank_probed
from conformance.ranks import protocol
from conformance.ranks.process import RankProcess, default_start_method

__all__ = ["DEFAULT_DEVICE_ENV", "RankCrashed", "RankError", "RankPool", "RankTimeout", "RemoteError"]

# The default device of tensors a rank function creates without naming one. Unset: torch's own (cpu).
# The project's own test runs set it to ``meta``: a body that forgets ``ctx.device`` then fails at its
# first collective or result ("no backend type associated with device type meta"), as it would over
# NCCL on a GPU, instead of passing on CPU by accident.
DEFAULT_DEVICE_ENV = "CONFORMANCE_RANK_DEFAULT_DEVICE"


@dataclass(frozen=True)
class RemoteError:
    rank: int
    exc_type: str
    message: str
    traceback: str


class RankError(AssertionError):
    """One or more ranks failed a call; ``errors`` holds each failing rank's remote exception, ``stacks``
    the Python stacks of the ranks that did not answer (where each was stuck), by rank."""

    def __init__(self, summary: str, errors: list[RemoteError] = (), stacks: dict[int, str] | None = None):
        self.summary = summary
        self.errors = list(errors)
        self.stacks = dict(stacks or {})
        parts = [summary]
        for err in self.errors:
            parts.append(f"--- rank {err.rank}: {err.exc_type}: {err.message}\n{err.traceback.rstrip()}")
        for rank, stack in sorted(self.stacks.items()):
            parts.append(f"--- rank {rank} did not answer; its threads were at:\n{stack}")
        super().__init__("\n".join(parts))

    @property
    def failed_ranks(self) -> list[int]:
        return [e.rank for e in self.errors]


class RankTimeout(RankError):
    """A call did not finish on every rank within its timeout."""


class RankCrashed(RankError):
    """A rank process died during a call or at start-up."""


def _describe(fn: Callable) -> tuple[str, str, str | None]:
    """(module, qualname, file) by which a rank process finds ``fn``."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    path = getattr(sys.modules.get(module), "__file__", None)
    if module == "__main__" and path:
        # Like multiprocessing's spawn: ranks load the script under another name, so its
        # ``if __name__ == "__main__"`` block does not run again.
        module = "__conformance_main__"
    if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"ranks.run needs a module-level function importable by the rank processes, got {fn!r}; "
            "define it at the top level of a module"
        )
    return module, qualname, path


class RankPool:
    """A persistent pool of ``world_size`` ranks of one backend (see the module docstring)."""

    def __init__(self, *, descriptor: str, device_type: str, backend: str, world_size: int,
                 setup_modules: tuple[str, ...] = (), timeout: float = 300.0,
                 startup_timeout: float = 180.0, grace: float = 5.0, workdir: str | None = None,
                 env: dict[str, str] | None = None, default_device: str | None = None,
                 symmetric_memory_backend: str | None = None, start_method: str | None = None,
                 rank_imports: tuple[str, ...] = ()):
        self.descriptor = descriptor
        self.device_type = device_type
        self.backend = backend
        self.world_size = world_size
        self.setup_modules = tuple(setup_modules)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.env = dict(os.environ if env is None else env)
        self.default_device = default_device or self.env.get(DEFAULT_DEVICE_ENV) or None
        self.symmetric_memory_backend = symmetric_memory_backend
        self.start_method = start_method or default_start_method(device_type)  # process.RankProcess.spawn
        self.rank_imports = tuple(rank_imports)  # imported once by a fork server before it forks the ranks
        self._tmp = tempfile.TemporaryDirectory(prefix=f"conformance-{descriptor}-{world_size}r-", dir=workdir)
        self.workdir = Path(self._tmp.name)
        self.shared_dir = self.workdir / "shared"
        self.shared_dir.mkdir()
        self.ranks: list[RankProcess] = []
        self.store = None
        self.generation = 0
        self.spawns = 0
        self.calls = 0  # numbers each call, so a late reply to an earlier one is never taken for its answer
        self.events: list[str] = []
        self.closed = False
        self._booting = False  # spawned, not yet known to be ready
        # From rank 0's first start: its device's name and the device-touching probes (capabilities.DEVICE_PROBES)
        self.device_name: str | None = None
        self.rank_probes: dict[str, tuple[bool, str]] | None = None
        # One selector per set of rank processes, built when first waited on (a call made a selector of
        # its own before: a measurable share of a trivial call); rebuilt whenever ``ranks`` is replaced.
        self._selector: selectors.BaseSelector | None = None
        self._selector_ranks: list[RankProcess] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self.ranks)

    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    def start(self) -> None:
        """Spawn the ranks if needed and wait until every one has joined the process group."""
        self.launch()
        if self._booting:
            self._booting = False
            self._await_ready()

    def launch(self) -> None:
        """Spawn the ranks without waiting for them (``start`` waits); a no-op when they are up."""
        if self.closed:
            raise RuntimeError("this RankPool is closed")
        if self.started:
            return
        self._booting = True
        self._spawn()

    def _spawn(self) -> None:
        import torch.distributed as dist

        # The controller hosts the rendezvous store on an OS-chosen port: pools in different pytest
        # (xdist) workers can never collide.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.generation += 1
        self.spawns += 1
        env = self._rank_env(self.world_size)
        self.ranks = [RankProcess.spawn(rank, self._rank_config(rank, world_size=self.world_size, store_host="127.0.0.1",
                                                                store_port=self.store.port),
                                        self.workdir / f"rank{rank}.log", env, self.start_method,
                                        self.rank_imports)
                      for rank in range(self.world_size)]

    def _rank_config(self, rank: int, *, world_size: int, store_host: str, store_port: int, **extra: Any) -> dict:
        """What rank ``rank`` of this start is told (``worker.run`` reads it): the pool's settings, the store
        it meets its peers at, whether it probes its device and which other capabilities (those of the
        modules it imports anyway: ``capabilities.rank_probed``), and ``extra`` (a launcher's keys)."""
        describe = self.describes_device(rank)
        return {
            "rank": rank, "world_size": world_size, "store_host": store_host, "store_port": store_port,
            "backend": self.backend, "device_type": self.device_type, "descriptor": self.descriptor,
            "setup_modules": list(self.setup_modules), "shared_dir": str(self.shared_dir),
            "generation": self.generation, "timeout": self.timeout, "startup_timeout": self.startup_timeout,
            "default_device": self.default_device, "symmetric_memory_backend": self.symmetric_memory_backend,
            "describe": describe, "probe": list(rank_probed(self.rank_imports)) if describe else [], **extra,
        }

    def describes_device(self, rank: int) -> bool:
        """Whether rank ``rank``, now starting, is to probe its device and name it in its ``ready``.

        Only rank 0's first answers are read (``probed_on_ranks``); each probe costs a rank about a second
        (the symmetric-memory probe imports sympy), again for every rank of every respawn. On an
        accelerator every rank of the first start probes all the same: a symmetric-memory allocation can
        be collective there (NVSHMEM's is), and rank 0 alone would wait for its peers forever."""
        return self.rank_probes is None and (rank == 0 or self.device_type != "cpu")

    def _rank_env(self, ranks_here: int) -> dict[str, str]:
        env = dict(self.env)
        # Ranks import test functions by module name: give them the controller's import path, as
        # multiprocessing's spawn does (pytest has inserted test roots into sys.path by now).
        search_path = [p for p in sys.path if p and os.path.isdir(p)]
        inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(search_path + inherited))
        if self.device_type == "cpu" and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks_here))
        return env

    def _await_ready(self) -> None:
        # With a grace: once a rank has failed to start, its peers wait for it at the rendezvous until the
        # start-up timeout; the pool cannot start anyway, so the failure is reported ``grace`` s later.
        replies = self._collect({protocol.READY, protocol.INIT_FAILED}, self.startup_timeout, grace=self.grace)
        errors = [self._as_remote_error(rank, reply) for rank, reply in sorted(replies.items())
                  if reply[0] != protocol.READY]
        missing = [r for r in range(self.world_size) if r not in replies]
        first = replies.get(0)
        if self.rank_probes is None and first is not None and first[0] == protocol.READY:
            self.device_name, self.rank_probes = first[1].get("device_name"), first[1].get("probes")
        if errors:
            self._teardown(f"start-up failed on rank(s) {_listed(e.rank for e in errors)}")
            waiting = (f"; rank {_listed(missing)} had not started {self.grace:g} s after that (waiting for its "
                       "peers)" if missing else "")
            raise RankCrashed(f"{self._label()}: the pool could not start: start-up failed on rank "
                              f"{_listed(e.rank for e in errors)}{waiting}", errors)
        if missing:
            stacks = self._stacks_of(missing)
            self._teardown(f"start-up timed out after {self.startup_timeout:g} s")
            raise RankTimeout(
                f"{self._label()}: start-up timed out after {self.startup_timeout:g} s; no answer from rank "
                f"{_listed(missing)} (a slow setup module, or a process group that cannot form)", stacks=stacks)

    def probed_on_ranks(self) -> dict[str, tuple[bool, str]]:
        """Rank 0's answers to the device-touching capability probes (starting the ranks if need be)."""
        if self.rank_probes is None and self.closed:
            raise RuntimeError("no test of this run started the ranks")
        if self.rank_probes is None:
            self.start()
        return self.rank_probes

    def close(self) -> None:
        """Shut every rank down (killing stragglers) and remove the pool's directory."""
        if self.closed:
            return
        for rank in self.ranks:
            rank.stop()
        self.ranks = []
        self.store = None
        self._drop_selector()
        self.closed = True
        self._tmp.cleanup()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _teardown(self, reason: str) -> None:
        self.events.append(f"pool respawned: {reason}")
        for rank in self.ranks:
            rank.kill()
        self.ranks = []
        self.store = None
        self._drop_selector()

    def _label(self) -> str:
        return f"{self.descriptor} pool ({self.world_size} ranks, {self.backend})"

    # -- calls -------------------------------------------------------------------------------------
    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        """run(fn, *args, **kwargs) -> [result of rank 0, ..., result of rank N-1].

        ``fn(ctx, *args, **kwargs)`` runs on every rank, ``ctx`` being its ``RankContext``. Tensors in
        results come back on CPU. Raises ``RankError`` (or ``RankTimeout``/``RankCrashed``).
        """
        # pytest leaves frames that set this out of a failure's traceback: the test's own call is what to
        # read (the ranks' tracebacks are in the error's message), and each frame shown costs a parse of
        # its file.
        __tracebackhide__ = True  # noqa: F841
        return self.run_with_timeout(self.timeout, fn, *args, **kwargs)

    def run_with_timeout(self, timeout: float, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        __tracebackhide__ = True  # noqa: F841 - see run
        module, qualname, path = _describe(fn)
        self.start()
        self.calls += 1
        message = protocol.encode(protocol.CALL, call=self.calls, module=module, qualname=qualname, path=path,
                                  args=args, kwargs=kwargs)  # pickled once for every rank
        for rank in self.ranks:
            rank.conn.send_bytes(message)
        replies = self._collect({protocol.RESULT, protocol.ERROR}, timeout, grace=self.grace, call=self.calls)
        return self._outcome(qualname, timeout, replies)

    def _outcome(self, what: str, timeout: float, replies: dict[int, tuple]) -> list[Any]:
        """The results in rank order, or the error that says what went wrong (after recovering).

        Every rank answered with a result -> results. Otherwise, in order of severity: a rank died ->
        respawn, ``RankCrashed``; nobody raised but some did not answer -> respawn, ``RankTimeout``;
        some raised and others did not answer (stuck in a collective) -> respawn, ``RankError``; some
        raised and all answered -> fresh process group, ``RankError``.
        """
        __tracebackhide__ = True  # noqa: F841 - see run
        errors = [self._as_remote_error(r, reply) for r, reply in sorted(replies.items())
                  if reply[0] != protocol.RESULT]
        missing = [r for r in range(self.world_size) if r not in replies]
        if not errors and not missing:
            return [replies[r][1]["value"] for r in range(self.world_size)]
        gone = [e.rank for e in errors if replies[e.rank][0] is protocol.RANK_GONE]
        # A rank that logged a fatal error but has not exited (stuck on its way out, e.g. on a corrupted
        # heap) is gone as well: its call will never answer, and it is a crash, not a hang of the call.
        # (Only a rank process of this pool can be read: a launcher's pool holds just its own.)
        for proc in [p for p in self.ranks if p.rank in missing]:
            if (fatal := proc.fatal_error()) is not None:
                errors.append(RemoteError(proc.rank, "RankGone", f"stopped answering after {fatal}", proc.last_output()))
                gone.append(proc.rank)
        if gone:
            self._teardown(f"rank {gone[0]} died during {what}")
            raise RankCrashed(f"{self._label()}: rank {_listed(gone)} died during {what}", errors)
        if not errors:
            stacks = self._stacks_of(missing)
            self._teardown(f"{what} timed out after {timeout:g} s")
            raise RankTimeout(
                f"{self._label()}: {what} timed out after {timeout:g} s; no answer from rank "
                f"{_listed(missing)} (hung, or waiting in a collective for a peer)", stacks=stacks)
        failing = _listed(e.rank for e in errors)
        if missing:
            stacks = self._stacks_of(missing)
            self._teardown(f"rank {failing} raised and rank {_listed(missing)} did not finish")
            raise RankError(
                f"{self._label()}: {what} raised on rank {failing}; rank {_listed(missing)} did not "
                f"finish within {self.grace:g} s after that (likely blocked in a collective); the pool "
                "was respawned", errors, stacks=stacks)
        self._reset_group(what)
        raise RankError(f"{self._label()}: {what} raised on rank {failing}", errors)

    def _reset_group(self, what: str) -> None:
        """Give every rank a fresh process group; respawn the pool if that fails."""
        self.generation += 1
        for rank in self.ranks:
            protocol.send(rank.conn, protocol.RESET_GROUP, generation=self.generation)
        replies = self._collect({protocol.GROUP_READY, protocol.ERROR}, 60.0)
        if len(replies) == self.world_size and all(r[0] == protocol.GROUP_READY for r in replies.values()):
            self.events.append(f"process group replaced after {what} raised")
        else:
            self._teardown(f"process group reset failed after {what} raised")

    def _stacks_of(self, missing: list[int], wait: float = 3.0) -> dict[int, str]:
        """{rank: its Python stacks} of the ranks of this process that did not answer, read before they are
        killed (a launcher's pool holds its own rank only); every rank is asked at once, ``wait`` s at most."""
        asked = [(proc, start) for proc in self.ranks if proc.rank in missing
                 if (start := proc.ask_for_stacks()) is not None]
        deadline = time.monotonic() + wait
        found = {proc.rank: proc.stacks_since(start, deadline) for proc, start in asked}
        return {rank: stack for rank, stack in found.items() if stack}

    def _as_remote_error(self, rank: int, reply: tuple) -> RemoteError:
        name, body = reply
        if name is protocol.RANK_GONE and body:  # described by the controller that watched it
            return RemoteError(rank, "RankGone", body["message"], body["traceback"])
        if name is protocol.RANK_GONE:
            proc = self.ranks[rank]
            return RemoteError(rank, "RankGone", proc.death_description(), proc.last_output())
        if name == protocol.INIT_FAILED:
            return RemoteError(rank, "InitFailed", "rank failed to start", body["traceback"])
        return RemoteError(rank, body["exc_type"], body["message"], body["traceback"])

    def _collect(self, wanted: set[str], timeout: float, *, grace: float | None = None,
                 call: int | None = None) -> dict[int, tuple]:
        """{rank: (message name, body)}: one reply per rank of the ``wanted`` kinds, or ``RANK_GONE`` for
        a rank whose channel closed, gathered for at most ``timeout`` s; with ``grace``, stop waiting
        ``grace`` s after the first error, failed start or death (the others may be stuck in a collective,
        or waiting for the failed rank at the rendezvous). With
        ``call``, a reply to another call is dropped (one left over from a call that ended early)."""
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        selector = self._rank_selector()
        set_aside = []  # answered ranks whose channel is readable again: not watched until this collect ends
        try:
            while len(replies) < len(self.ranks):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    rank = key.data
                    if rank.rank in replies:  # nothing more is read from it now (as if it were not waited on)
                        selector.unregister(rank.conn)
                        set_aside.append(rank)
                        continue
                    try:
                        name, body = protocol.recv_or_unreadable(rank.conn)
                    except (EOFError, OSError):
                        rank.wait(timeout=10)
                        name, body = protocol.RANK_GONE, {}
                    if self._late(rank.rank, name, body, wanted, call):
                        continue
                    if name in wanted or name is protocol.RANK_GONE:
                        replies[rank.rank] = (name, body)
                    if grace is not None and name in (protocol.ERROR, protocol.INIT_FAILED, protocol.RANK_GONE):
                        deadline = min(deadline, time.monotonic() + grace)
                        grace = None
        finally:
            for rank in set_aside:
                selector.register(rank.conn, selectors.EVENT_READ, rank)
        return replies

    def _rank_selector(self) -> selectors.BaseSelector:
        """The selector over the channels of ``ranks`` (readable: a reply, or a closed channel)."""
        if self._selector is None or self._selector_ranks is not self.ranks:
            self._drop_selector()
            self._selector, self._selector_ranks = selectors.DefaultSelector(), self.ranks
            for rank in self.ranks:
                self._selector.register(rank.conn, selectors.EVENT_READ, rank)
        return self._selector

    def _drop_selector(self) -> None:
        if self._selector is not None:
            self._selector.close()
        self._selector = self._selector_ranks = None

    def _late(self, rank: int, name, body: dict, wanted: set[str], call: int | None) -> bool:
        """Whether a reply answers an earlier call than ``call`` (and is to be dropped, with an event)."""
        if body.get("exc_type") == protocol.UNREADABLE:
            body["call"] = call  # unreadable, so unnumbered: it answers the call being collected
            return False
        if call is None or name not in wanted or body.get("call") == call:
            return False
        self.events.append(f"dropped a late {name} reply of rank {rank} to call {body.get('call')}")
        return True


def _listed(ranks) -> str:
    return ", ".join(map(str, ranks))
