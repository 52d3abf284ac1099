"""torchrun on 127.0.0.1 for the project's tests: one ``--standalone`` node or several "nodes" with a static
or c10d rendezvous, each launcher process tagged so that a test can check none outlived the run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid

from conformance.report import validate_report
from tests.conformance.tagged_processes import processes_tagged

TORCHRUN = shutil.which("torchrun") or f"{sys.executable} -m torch.distributed.run"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, args: list[str], *, nodes: int = 2, nproc: int = 1, rdzv: str = "static",
           node_env: list[dict] | None = None, timeout: float = 900):
    """Start torchrun on 127.0.0.1 (one ``--standalone`` node, or ``nodes`` "nodes" with a static or c10d
    rendezvous, each with its ``node_env``) and wait for every node: [(returncode, output)] by node rank."""
    port, tag = free_port(), uuid.uuid4().hex
    env = {**os.environ, "CONFORMANCE_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
    procs = []
    for node in range(nodes):
        if nodes == 1:
            rendezvous = ["--standalone"]
        elif rdzv == "static":
            rendezvous = ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                          "--master-port", str(port)]
        else:
            rendezvous = ["--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", tag]
        cmd = TORCHRUN.split() + [*rendezvous, "--nproc-per-node", str(nproc), *args]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env={**env, **(node_env or [{}] * nodes)[node]},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert processes_tagged(tag) == [], "a rank or launcher process outlived the run"
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def launch_nodes(tmp_path, args: list[str], *, nproc: int = 1, rdzv: str = "static", timeout: float = 900):
    """Two torchrun "nodes" on 127.0.0.1: [(returncode, output)] by node rank."""
    return launch(tmp_path, args, nodes=2, nproc=nproc, rdzv=rdzv, timeout=timeout)


def report_in(tmp_path):
    """The report the run wrote to ``r.json``, validated."""
    return validate_report(json.loads((tmp_path / "r.json").read_text()))
