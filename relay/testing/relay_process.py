"""``relay serve`` as a real process of its own on 127.0.0.1, for tests that kill it, restart it or run several.

Started by a test (``RelayProcess(env, log_path).start()``, ``env`` the ``RELAY_*`` settings); waits
until the process itself listens on its port and ``/readyz`` answers 200 (another server may have taken
the port first: then it starts again on a fresh one). Its output goes to ``log_path``; ``post`` sends a
webhook signed with the first of its webhook secrets; ``kill`` is ``kill -9``.

By default the process is forked from a parent that has imported the relay already (multiprocessing's
forkserver, with ``SERVE_IMPORTS`` preloaded): a fresh interpreter spends about 1.5 s of CPU importing what
``relay serve`` needs, and the relay's tests start dozens of relays. The fork then runs ``relay serve`` as
``python -m relay.cli serve`` would: the relay's environment only, the checkout's root as its working
directory, its output in the log, its own signal handlers. ``fresh=True`` starts that command instead (the
onboarding trial does, as a user would).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from relay.testing.loopback import loopback_client

__all__ = ["SERVE_IMPORTS", "RelayProcess", "free_port"]

# What ``relay serve`` imports before it serves (``relay.cli.serve``), and the drivers of both stores.
SERVE_IMPORTS = ["relay.cli", "relay.app", "relay.assembly", "relay.logs", "relay.store", "relay.web.serving",
                 "uvicorn", "psycopg", "sqlalchemy.dialects.postgresql.psycopg", "sqlalchemy.dialects.sqlite",
                 "alembic.command", "alembic.runtime.migration"]
CHECKOUT = Path(__file__).resolve().parents[2]  # a checkout's root: its relay is the one served


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RelayProcess:
    """``relay serve`` as a real subprocess (for kill -9 and multi-process tests); stderr goes to a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, *, fresh: bool = False):
        self.env = env
        self.log_path = log_path
        self.fresh = fresh  # a new interpreter rather than a fork of the pre-imported parent
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | ForkedServe | None = None

    def start(self, timeout: float = 60) -> "RelayProcess":
        """Start ``relay serve`` and wait until it, not some other process on its port, answers ``/readyz``.

        ``free_port`` only finds a port that was free a moment ago; another test's server may take it first.
        So the relay counts as up only once its own process listens on the port, and a relay that could not
        bind its port is started again on a fresh one.
        """
        for _ in range(3):
            outcome = self._start_once(timeout)
            if outcome != "port taken":
                return self
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
        raise RuntimeError(f"relay serve found its port taken three times: {self.log_path.read_text()[-2000:]}")

    def _start_once(self, timeout: float) -> str:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        environment.update(self.env)
        argv = ["serve", "--port", str(self.port)]
        with open(self.log_path, "ab") as log:  # here, so that the log exists even if the relay never starts
            log_start = log.tell()
            if self.fresh or not sys.platform.startswith("linux"):
                self.process = subprocess.Popen([sys.executable, "-m", "relay.cli", *argv], stdout=log,
                                                stderr=subprocess.STDOUT, env=environment, cwd=CHECKOUT)
            else:
                self.process = ForkedServe.start(argv, environment, self.log_path)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                with open(self.log_path, "rb") as log_file:
                    log_file.seek(log_start)
                    if b"address already in use" in log_file.read().lower():  # uvicorn logs this at ERROR
                        return "port taken"
                raise RuntimeError(f"relay serve exited with {self.process.returncode}: {self.log_path.read_text()[-2000:]}")
            if self._listening():
                try:
                    if loopback_client().get(f"{self.url}/readyz", timeout=1).status_code == 200:
                        return "ready"
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                self.process.kill()  # a relay that never came up must not outlive the test that started it
                self.process.wait(10)
                raise RuntimeError(f"relay serve did not become healthy: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def _listening(self) -> bool:
        import psutil

        try:
            sockets = psutil.Process(self.process.pid).net_connections(kind="tcp4")
        except psutil.Error:  # it has just exited: the next poll says how
            return False
        return any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except Exception:
                self.process.kill()
                self.process.wait(5)

    def signature(self, body: bytes) -> str:
        """``X-Hub-Signature-256`` of ``body`` under the first of the relay's webhook secrets."""
        secret = self.env["RELAY_WEBHOOK_SECRETS"].split(",")[0].strip()
        return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()

    def post(self, event: str, payload: dict, delivery: str) -> httpx.Response:
        """A signed webhook of ``event`` with ``payload``, as GitHub sends it."""
        body = json.dumps(payload).encode()
        return loopback_client().post(f"{self.url}/github/webhook", content=body, timeout=30, headers={
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": self.signature(body),
            "Content-Type": "application/json"})


class ForkedServe:
    """``relay serve`` forked from the pre-imported parent: the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, process: multiprocessing.process.BaseProcess):
        self._process = process

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], log_path: Path) -> "ForkedServe":
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(SERVE_IMPORTS)  # read when the forkserver first starts
        # Daemonic: a relay a test left running is stopped when the test process exits, not waited for.
        process = context.Process(target=_serve_in_fork, args=(argv, env, str(log_path)), name="relay serve",
                                  daemon=True)
        process.start()
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("relay serve", timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:  # not once reaped: the pid may be another process's by then
            os.kill(self._process.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _serve_in_fork(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked child: ``python -m relay.cli <argv>`` with ``env`` as its whole environment, the checkout's
    root as its working directory and its output appended to ``log_path``; exits with its code."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(CHECKOUT)
    from relay.cli import main

    try:
        code = main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)
