"""A private PostgreSQL cluster for fault tests: freeze it (SIGSTOP), thaw it, stop it, without touching
the server every other test shares.

``initdb`` into a temporary folder as the ``postgres`` user, on a port the OS chose, trust auth on
loopback only; torn down (``pg_ctl stop -m immediate`` and the folder removed) by the context manager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.relay.helpers import free_port

BIN = Path(os.environ.get("RELAY_TEST_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))


def unavailable() -> str | None:
    """Why a private cluster cannot be started here, or None."""
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {BIN} (RELAY_TEST_POSTGRES_BIN)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "a private PostgreSQL cluster needs root (initdb runs as the postgres user through runuser)"
    return None


def _as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, timeout=60)


class PrivateCluster:
    def __init__(self, folder: Path, port: int):
        self.folder, self.port = folder, port
        self.data = folder / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _pids(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, ...)."""
        postmaster = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                        children.append(int(entry.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        """SIGSTOP every process of the cluster: connections stay open, nothing answers."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self._pids()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def private_cluster(**settings: str):
    """A started cluster; ``settings`` are server settings (``autovacuum_naptime="1s"``)."""
    folder = Path(tempfile.mkdtemp(prefix="relay-pg-"))
    shutil.chown(folder, "postgres", "postgres")
    cluster = PrivateCluster(folder, free_port())
    try:
        _as_postgres(str(BIN / "initdb"), "-D", str(cluster.data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {cluster.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        options += "".join(f" -c {name}={value}" for name, value in settings.items())
        _as_postgres(str(BIN / "pg_ctl"), "-D", str(cluster.data), "-o", options, "-w", "-l", str(folder / "log"), "start")
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.thaw()
        with contextlib.suppress(Exception):
            _as_postgres(str(BIN / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
