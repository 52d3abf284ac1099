"""Benchmark: signed pull_request webhooks against ``relay serve`` on loopback, 32 concurrent clients.

Servers, each a separate process on the same uvicorn settings, in the same run:
* ``bare``: a FastAPI endpoint that reads the body and answers 202 (the baseline);
* ``relay-sqlite``: ``relay serve`` with its default SQLite store and default settings: the dispatcher
  runs, paced to GitHub's content-creation limit (80 dispatches a minute per credential);
* ``sqlite-intake-only``: the same with ``RELAY_DISPATCHER_ENABLED=false`` (intake's own cost);
* ``sqlite-unpaced``: the same with pacing off, so the dispatcher sends 4 dispatches per webhook to the
  fake GitHub as fast as it can, in the same process (a stress case GitHub itself would refuse);
* ``relay-postgresql``: ``relay serve`` on PostgreSQL ($RELAY_TEST_POSTGRES_URL; skipped if unreachable).
Every request carries a ~25 KB pull_request body of its own (a sequence number) with a new delivery id,
so the relay verifies, parses,
routes to 4 backends and durably commits 1 delivery + 4 outbox rows per request before answering.
Reports throughput, p50/p99 latency and the server's CPU time per request (Linux: from /proc; it is
less sensitive than throughput to other load on the machine) per server.

    python bench/relay_intake.py [--seconds 4] [--clients 32]

Ends with one JSON line; ratio = relay-sqlite throughput / bare throughput (higher is better);
``postgresql_ratio`` likewise for relay-postgresql.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECRET = "bench-secret"
PAYLOAD = ROOT.parent / "shared" / "github-payloads" / "pull_request__opened.payload.json"

BARE_APP = '''
import sys, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
app = FastAPI()
@app.post("/github/webhook")
async def hook(request: Request):
    await request.body()
    return JSONResponse({"status": "queued"}, status_code=202)
@app.get("/healthz")
def healthz():
    return {"status": "ok"}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
'''


def _body() -> bytes:
    if PAYLOAD.is_file():
        payload = json.loads(PAYLOAD.read_text())
        payload["repository"]["full_name"] = "pytorch/pytorch"
    else:  # a synthetic body of the same size
        payload = {"action": "opened", "number": 1, "repository": {"full_name": "pytorch/pytorch"},
                   "sender": {"login": "bench"},
                   "pull_request": {"number": 1, "state": "open", "labels": [], "updated_at": "2024-01-01T00:00:00Z",
                                    "head": {"sha": "a" * 40, "ref": "f"}, "base": {"sha": "b" * 40, "ref": "main"},
                                    "body": "x" * 27000}}
    # A sequence number per request (see _load): the relay answers an identical signed body under a
    # new delivery id as a replay ("duplicate"), so every request must carry a body of its own.
    payload["bench_seq"] = _SEQ_PLACEHOLDER
    return json.dumps(payload).encode()


_SEQ_PLACEHOLDER = "BENCHSEQ0000"  # 12 characters, found nowhere else in the body
_SEQUENCE = itertools.count()  # one for the process: warm-up and measured runs never repeat a body


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], env: dict[str, str], port: int) -> subprocess.Popen:
    log = tempfile.NamedTemporaryFile(prefix="relay-bench-", suffix=".log", delete=False)
    process = subprocess.Popen(args, env=env, cwd=ROOT, stdout=log, stderr=log)
    process.log_path = log.name
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("server did not start")


async def _load(port: int, body: bytes, seconds: float, clients: int) -> tuple[list[float], int]:
    """32 keep-alive connections speaking plain HTTP/1.1 over asyncio streams.

    A general-purpose client (httpx) costs more CPU per request than the bare endpoint does, and on a
    2-core machine it would measure itself; writing the request bytes directly keeps the load generator cheap.
    """
    before, after = body.split(_SEQ_PLACEHOLDER.encode(), 1)
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop_at:
                unique = before + f"{next(_SEQUENCE):012d}".encode() + after  # same size as the template
                signature = "sha256=" + hmac.new(SECRET.encode(), unique, hashlib.sha256).hexdigest()
                head = (
                    f"POST /github/webhook HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-GitHub-Event: pull_request\r\n"
                    f"X-GitHub-Delivery: {uuid.uuid4()}\r\nX-Hub-Signature-256: {signature}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                start = time.perf_counter()
                writer.write(head + unique)
                await writer.drain()
                status_line = await reader.readline()
                length = 0
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - start)
                if status_line.split()[1:2] != [b"202"]:
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, errors


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(name: str, server: subprocess.Popen, port: int, body: bytes, seconds: float, clients: int) -> dict:
    asyncio.run(_load(port, body, min(1.0, seconds / 4), clients))  # warm-up
    cpu_before = _cpu_seconds(server.pid)
    latencies, errors = asyncio.run(_load(port, body, seconds, clients))
    cpu_after = _cpu_seconds(server.pid)
    latencies.sort()
    figures = {
        "requests": len(latencies), "errors": errors, "rps": round(len(latencies) / seconds, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2),
    }
    cpu = ""
    if cpu_before is not None and cpu_after is not None and latencies:
        figures["cpu_ms_per_request"] = round((cpu_after - cpu_before) / len(latencies) * 1000, 3)
        cpu = f"   cpu {figures['cpu_ms_per_request']:5.2f} ms/req"
    print(f"{name:18s} {figures['rps']:8.1f} req/s   p50 {figures['p50_ms']:7.2f} ms   p99 {figures['p99_ms']:7.2f} ms"
          f"{cpu}   ({figures['requests']} requests, {errors} not 202)")
    return figures


_ADMIN_URL = os.environ.get("RELAY_TEST_POSTGRES_URL", "postgresql://relay:relay@127.0.0.1:5432/postgres")


def _postgres_url() -> str | None:
    from relay.store import create_scratch_database

    try:
        return create_scratch_database(_ADMIN_URL, "relay_bench")
    except Exception as exc:  # noqa: BLE001 - any failure means "no PostgreSQL here"
        print(f"relay-postgresql   skipped: no PostgreSQL at RELAY_TEST_POSTGRES_URL ({type(exc).__name__})")
        return None


def _drop(url: str) -> None:
    from relay.store import drop_scratch_database

    drop_scratch_database(_ADMIN_URL, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per server")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    from relay.testing import FakeGitHub

    body = _body()
    print(f"body {len(body)} bytes, {args.clients} concurrent clients, {args.seconds:g} s per server")
    results: dict[str, dict] = {}
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    with FakeGitHub() as fake, tempfile.TemporaryDirectory() as workdir:
        backends = Path(workdir) / "backends"
        backends.mkdir()
        for name in ("l1", "l2", "l3", "l4"):
            (backends / f"{name}.yaml").write_text(
                f"name: {name}\ndevice_type: cpu\ndetect: {{accelerator: none}}\ndistributed_backend: gloo\n"
                "capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, "
                "symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}\n"
                f"relay: {{repository: org/{name}-ci, level: {name.upper()}}}\n")
        port = _free_port()
        bare = _start([sys.executable, "-c", BARE_APP, str(port)], base_env, port)
        try:
            results["bare"] = _measure("bare FastAPI", bare, port, body, args.seconds, args.clients)
        finally:
            bare.terminate()
            bare.wait()
        # (name, database, extra settings); pacing and the dispatcher are at their defaults unless named
        targets = [("relay-sqlite", f"sqlite:///{Path(workdir) / 'relay.db'}", {}),
                   ("sqlite-intake-only", f"sqlite:///{Path(workdir) / 'intake.db'}", {"RELAY_DISPATCHER_ENABLED": "false"}),
                   ("sqlite-unpaced", f"sqlite:///{Path(workdir) / 'unpaced.db'}",
                    {"RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0"})]
        pg = _postgres_url()
        if pg:
            targets.append(("relay-postgresql", pg, {}))
        for name, database_url, extra in targets:
            port = _free_port()
            env = {**base_env, "RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_TOKEN": "test-token",
                   "RELAY_GITHUB_API_URL": fake.url, "RELAY_DATABASE_URL": database_url,
                   "RELAY_BACKENDS_DIR": str(backends), "RELAY_LOG_LEVEL": "WARNING", **extra}
            relay = _start([sys.executable, "-m", "relay.cli", "serve", "--port", str(port)], env, port)
            try:
                results[name] = _measure(name, relay, port, body, args.seconds, args.clients)
            finally:
                relay.terminate()
                relay.wait()
        if pg:
            _drop(pg)
    ratio = results["relay-sqlite"]["rps"] / results["bare"]["rps"]
    figures = {f"{name}_{key}": value for name, f in results.items() for key, value in f.items()}
    if "relay-postgresql" in results:
        figures["postgresql_ratio"] = round(results["relay-postgresql"]["rps"] / results["bare"]["rps"], 3)
    print(f"relay-sqlite / bare throughput: {ratio:.2f}"
          + (f"; relay-postgresql / bare: {figures['postgresql_ratio']:.2f}" if "postgresql_ratio" in figures else ""))
    print(json.dumps({"name": "relay_intake", "figures": figures, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
