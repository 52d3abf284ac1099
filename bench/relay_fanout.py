"""Benchmark: one upstream event fanned out to 50 backend repositories, GitHub answering in 50 ms each.

Measures the time from the webhook's POST until the fake GitHub has accepted all 50 dispatches, through
the real relay (intake -> store -> dispatcher -> github3 -> HTTP), against the same 50 calls made one
after another with the same client in the same run (the serial baseline, about 50 x 50 ms).
Each repetition uses a fresh relay and database (default settings, SQLite), so GitHub pacing starts full.

    python bench/relay_fanout.py [--backends 50] [--latency 0.05] [--repeat 3]

Ends with one JSON line: {"name", "figures", "ratio"}; ratio = fan-out time / serial time (lower is better).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relay import create_app, load_settings  # noqa: E402
from relay.github import GitHubClient  # noqa: E402
from relay.testing import FakeGitHub  # noqa: E402

SECRET = "bench-secret"


def _backends(folder: Path, count: int) -> None:
    for index in range(count):
        (folder / f"b{index:02d}.yaml").write_text(
            f"name: b{index:02d}\ndevice_type: cpu\ndetect: {{accelerator: none}}\ndistributed_backend: gloo\n"
            "capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, "
            "symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}\n"
            f"relay: {{repository: org/b{index:02d}-ci, level: L2}}\n"
        )


def _push_body() -> bytes:
    return json.dumps({"ref": "refs/heads/main", "before": "a" * 40, "after": "b" * 40, "deleted": False,
                       "repository": {"full_name": "pytorch/pytorch"}, "sender": {"login": "bench"}}).encode()


def fan_out_once(fake: FakeGitHub, count: int, workdir: Path) -> float:
    backends = workdir / "backends"
    backends.mkdir()
    _backends(backends, count)
    settings = load_settings(
        webhook_secrets=SECRET, github_token="test-token", github_api_url=fake.url,
        database_url=f"sqlite:///{workdir / 'relay.db'}", backends_dir=str(backends), log_level="WARNING",
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    body = _push_body()
    already = len(fake.dispatches())
    start = time.perf_counter()
    answer = httpx.post(f"http://127.0.0.1:{port}/github/webhook", content=body, headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": f"bench-{time.time_ns()}", "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()})
    assert answer.status_code == 202, answer.text
    while len(fake.dispatches()) - already < count:
        time.sleep(0.001)
    elapsed = time.perf_counter() - start
    server.should_exit = True
    thread.join()
    return elapsed


def serial_baseline(fake: FakeGitHub, count: int) -> float:
    client = GitHubClient(fake.url, token="test-token")
    client.repository_dispatch("org/warmup", "push", {})
    start = time.perf_counter()
    for index in range(count):
        client.repository_dispatch(f"org/b{index:02d}-ci", "push", {"n": index})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=int, default=50)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the fake GitHub takes per call")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with FakeGitHub(latency=args.latency) as fake:
        serial = serial_baseline(fake, args.backends)
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as workdir:
                runs.append(fan_out_once(fake, args.backends, Path(workdir)))
    fan_out = statistics.median(runs)
    print(f"fake GitHub latency           {args.latency * 1000:.0f} ms per call")
    print(f"serial, {args.backends} calls            {serial:.3f} s")
    print(f"relay fan-out to {args.backends} backends  {fan_out:.3f} s (median of {args.repeat}: "
          + ", ".join(f"{r:.3f}" for r in runs) + ")")
    print(f"speed-up                      {serial / fan_out:.1f}x")
    figures = {"backends": args.backends, "latency_s": args.latency, "serial_s": round(serial, 4),
               "fanout_s": round(fan_out, 4), "fanout_runs_s": [round(r, 4) for r in runs]}
    print(json.dumps({"name": "relay_fanout", "figures": figures, "ratio": round(fan_out / serial, 4)}))


if __name__ == "__main__":
    main()
