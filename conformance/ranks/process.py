"""Rank processes: start one, watch it, read its last output, kill it.

Used by ``conformance.ranks.pool`` and ``launcher``. Each rank has one end of a socketpair as its
channel and its stdout/stderr in a log file, so a crash can be reported with the rank's last lines.
It starts by one of two methods: a fresh ``python -m conformance.ranks.worker`` (``SPAWN``), or forked
by the controller's server that has imported torch once (``FORKSERVER``, ``conformance.ranks.forkserver``);
``default_start_method`` chooses by device.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from conformance.ranks import forkserver, protocol

FATAL_ERROR = "Fatal Python error:"  # faulthandler's first line when a signal kills the rank


SPAWN, FORKSERVER = "spawn", "forkserver"
_WORKER_PATH = re.escape(str(Path(__file__).with_name("worker.py")))
_WORKER_RUN_FRAME = re.compile(rf'\s+File "{_WORKER_PATH}", line \d+ in run$')


def _without_start_up(lines: list[str]) -> list[str]:
    """A rank's log without what faulthandler adds below the test's own code: the frames under the
    worker's ``run`` (how the rank was started: runpy's, or its server's and, for a server forked from its
    controller, the controller's) and the list of loaded extension modules (the controller's too, then)."""
    kept, in_start_up = [], False
    for line in lines:
        if in_start_up and line.startswith("  File "):
            continue
        in_start_up = bool(_WORKER_RUN_FRAME.match(line))
        if not line.startswith("Extension modules: "):
            kept.append(line)
    return kept


def default_start_method(device_type: str) -> str:
    """How a pool starts ranks of ``device_type``: forked from a server that has imported torch on CPU
    (each fresh rank costs about 2 s of the cores the ranks share, again on every respawn); fresh
    interpreters on an accelerator, whose runtime must never be inherited across a fork."""
    return FORKSERVER if device_type == "cpu" else SPAWN


def fork_server_here(device_type: str) -> bool:
    """Where ranks of ``device_type`` are forked (``default_start_method``), make their server a copy of this
    process now, before it starts a thread (a pool's store, a probe), rather than a fresh interpreter importing
    torch again (``forkserver.fork_here``); True when it did."""
    if default_start_method(device_type) != FORKSERVER:
        return False
    import torch.distributed  # noqa: F401 - the pools import it anyway; the copy has it

    return forkserver.fork_here()


@dataclass
class RankProcess:
    rank: int
    process: subprocess.Popen | forkserver.ForkedRank  # either way: pid, poll(), wait(timeout)
    conn: Connection
    log_path: Path

    @classmethod
    def spawn(cls, rank: int, config: dict, log_path: Path, env: dict[str, str],
              method: str = SPAWN, imports: tuple[str, ...] = ()) -> "RankProcess":
        """Start rank ``rank`` by ``method`` (``SPAWN`` or ``FORKSERVER``); a fork server imports ``imports``
        before it forks the rank, once for all its ranks (a fresh rank imports what it uses itself)."""
        if method not in (SPAWN, FORKSERVER):
            raise ValueError(f"unknown start method {method!r}: expected {SPAWN!r} or {FORKSERVER!r}")
        parent_sock, child_sock = socket.socketpair()
        child_fd = child_sock.fileno()
        try:
            if method == FORKSERVER:
                process = forkserver.fork_rank(config, child_fd, str(log_path), env, imports)
            else:
                with open(log_path, "wb") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "conformance.ranks.worker", json.dumps({**config, "fd": child_fd})],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        pass_fds=(child_fd,), env=env, close_fds=True,
                    )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        conn = Connection(parent_sock.detach())
        return cls(rank=rank, process=process, conn=conn, log_path=log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int:
        """The exit code once the rank has exited; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        return self.process.wait(timeout=timeout)

    def exit_description(self) -> str:
        code = self.process.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name} (exit code {code})"
        return f"exited with code {code}"

    def fatal_error(self) -> str | None:
        """The fatal error's own words from the rank's log, or None: faulthandler's ``Fatal Python error:
        ...`` line and, after an abort, the line before it (glibc's ``malloc(): ...`` on heap corruption,
        or a C++ ``terminate called ...``)."""
        lines = self._log_lines()
        fatal = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(FATAL_ERROR)), None)
        if fatal is None:
            return None
        words = [lines[fatal].strip()]
        if words[0].endswith("Aborted") and fatal > 0 and lines[fatal - 1].strip():
            words.insert(0, lines[fatal - 1].strip())
        return " / ".join(words)

    def death_description(self, where: str = "") -> str:
        """How the rank ended (``exit_description``), with its fatal error when it logged one.
        ``where``: e.g. " on node-1"."""
        fatal = self.fatal_error()
        return self.exit_description() + where + (f": {fatal}" if fatal else "")

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(_without_start_up(self._log_lines())[-lines:])

    def last_output(self) -> str:
        """The tail of the log, headed for a crash report."""
        return f"last output of rank {self.rank}:\n{self.output_tail()}"

    def ask_for_stacks(self) -> int | None:
        """Signal this live rank to write every thread's Python stack to its log (``protocol.STACKS_SIGNAL``);
        the log's size before, to read them from with ``stacks_since``, or None when the rank is gone. Only
        for a rank about to be killed: one that has not yet registered the handler dies of the signal."""
        try:
            start = self.log_path.stat().st_size
            os.kill(self.pid, protocol.STACKS_SIGNAL)
        except (OSError, ProcessLookupError):
            return None
        return start

    def stacks_since(self, start: int, deadline: float) -> str | None:
        """What the rank wrote to its log after ``start`` once it stopped writing (where a hung call is
        stuck), without the frames of how it was started; None if nothing came by ``deadline`` (monotonic)."""
        size = start
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                now = self.log_path.stat().st_size
            except OSError:  # the log is gone: nothing to show
                return None
            if start < now == size:  # it has written, and then stayed still a moment
                break
            size = now
        return "\n".join(_without_start_up(self._log_lines(start))).strip() or None

    def _log_lines(self, start: int = 0) -> list[str]:
        """The log's lines from byte ``start`` on ([] when it cannot be read)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                return log.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def kill(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the rank to shut down, then kill it if it has not left within ``grace`` seconds."""
        try:
            protocol.send(self.conn, protocol.SHUTDOWN)
        except OSError:
            pass
        try:
            self.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
