"""Rank processes: spawn one, watch it, read its last output, kill it.

Used only by ``conformance.ranks.pool``. Each rank is ``python -m conformance.ranks.worker`` with one
end of a socketpair as its channel and its stdout/stderr in a log file, so a crash can be reported
with the rank's last lines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from conformance.ranks import protocol

FATAL_ERROR = "Fatal Python error:"  # faulthandler's first line when a signal kills the rank


@dataclass
class RankProcess:
    rank: int
    popen: subprocess.Popen
    conn: Connection
    log_path: Path

    @classmethod
    def spawn(cls, rank: int, config: dict, log_path: Path, env: dict[str, str]) -> "RankProcess":
        parent_sock, child_sock = socket.socketpair()
        child_fd = child_sock.fileno()
        log = open(log_path, "wb")
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "conformance.ranks.worker", json.dumps({**config, "fd": child_fd})],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(child_fd,), env=env, close_fds=True,
            )
        finally:
            log.close()
            child_sock.close()
        conn = Connection(parent_sock.detach())
        return cls(rank=rank, popen=popen, conn=conn, log_path=log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_description(self) -> str:
        code = self.popen.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name} (exit code {code})"
        return f"exited with code {code}"

    def output_tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines. A rank killed by a signal ends its log with faulthandler's
        stacks, which can fill them: the fatal error's own lines (the line before faulthandler's, e.g.
        glibc's ``malloc(): ...`` on SIGABRT, and ``Fatal Python error: ...``) then lead the tail."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        all_lines = text.splitlines()
        tail = all_lines[-lines:]
        fatal = next((i for i in range(len(all_lines) - 1, -1, -1) if all_lines[i].startswith(FATAL_ERROR)), None)
        if fatal is not None and fatal < len(all_lines) - lines:
            tail = [line for line in all_lines[max(0, fatal - 1):fatal + 1] if line.strip()] + ["..."] + tail
        return "\n".join(tail)

    def kill(self) -> None:
        if self.alive():
            try:
                os.kill(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
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
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
