"""Benchmark: does intake outrank bulk writes? Webhook latency while maximal reports are stored.

For each store (a SQLite file; PostgreSQL at $RELAY_TEST_POSTGRES_URL, skipped if unreachable), one
``relay serve`` process with a fake GitHub on loopback, in the same run:

* ``alone``: push webhooks at a steady rate (``--rate`` per second) for ``--seconds`` (the baseline);
* ``under reports``: the same webhooks while ``--reports`` maximal ``completed`` callbacks (20 000 tests,
  about 8 MB each, the relay's default limits) are stored at once.

Prints, per store and phase, the webhooks sent, how many got 503, and p50 / p99 / max latency; then one
JSON line with ``p99_ratio`` (under reports / alone) per store and the 503 counts.

    python bench/intake_under_reports.py [--reports 8] [--rate 20] [--seconds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from relay.testing import FakeGitHub
from relay.testing.relay_process import RelayProcess
from relay.testing.sample_report import conformance_report
from relay_intake import _drop, _postgres_url  # bench/relay_intake.py: a fresh PostgreSQL database per run

SECRET = "bench-secret"
TOKEN = "static-token-bench-0123456789abcdef"
UPSTREAM = "pytorch/pytorch"
DOWNSTREAM = "org/bench-ci"
MAX_TESTS = 20_000


def _backends(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    (folder / "bench.yaml").write_text(
        "name: bench\ndevice_type: cpu\ndetect: {accelerator: none}\ndistributed_backend: gloo\n"
        "capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, symmetric_memory: false, "
        "put_signal: false, bf16: true, parallelisms: true}\n"
        f"relay: {{repository: {DOWNSTREAM}, level: L2, callback_token_sha256: '{digest}'}}\n")
    return folder


def _webhook(url: str, event: str, payload: dict, delivery: str) -> httpx.Response:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return httpx.post(f"{url}/github/webhook", content=body, timeout=30, headers={
        "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signature,
        "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench"})


def _pull_request(number: int) -> dict:
    return {"action": "opened", "number": number, "repository": {"full_name": UPSTREAM}, "sender": {"login": "octocat"},
            "pull_request": {"number": number, "state": "open", "title": "bench", "draft": False, "labels": [],
                             "html_url": f"https://github.com/{UPSTREAM}/pull/{number}",
                             "updated_at": "2026-12-01T10:00:00Z",
                             "head": {"sha": f"{number:040x}", "ref": f"bench-{number}",
                                      "repo": {"full_name": "someone/fork"}},
                             "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": UPSTREAM}}}}


def _push(index: int) -> dict:
    return {"ref": "refs/heads/main", "before": "b" * 40, "after": f"{index + 1:040x}", "created": False,
            "deleted": False, "forced": False, "base_ref": None, "commits": [],
            "repository": {"full_name": UPSTREAM}, "sender": {"login": "octocat"}}


def _maximal_report(number: int) -> dict:
    tests = [(f"conformance/suites/test_bench_{i % 40}.py::test_case_{i}[param-{number}-{i:06d}]",
              "failed" if i % 7 == 0 else "passed", f"AssertionError: rank {i % 8} got {i}; " + "m" * 190)
             for i in range(MAX_TESTS)]
    return conformance_report("bench", tests, git_version=f"{number:040x}")


def _callback(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/github/callback", json=body, timeout=120,
                      headers={"Authorization": f"Token {TOKEN}"})


def _webhooks_at_rate(url: str, rate: float, until, prefix: str) -> list[tuple[float, int]]:
    """Push webhooks ``rate`` a second (each on a thread of its own) until ``until()``: (seconds, status)."""
    results: list[tuple[float, int]] = []
    threads = []

    def one(index: int) -> None:
        started = time.monotonic()
        try:
            status = _webhook(url, "push", _push(index), f"{prefix}-{index}").status_code
        except httpx.HTTPError:
            status = 0
        results.append((time.monotonic() - started, status))

    index, next_at = 0, time.monotonic()
    while not until():
        thread = threading.Thread(target=one, args=(index,))
        thread.start()
        threads.append(thread)
        index += 1
        next_at += 1.0 / rate
        time.sleep(max(next_at - time.monotonic(), 0))
    for thread in threads:
        thread.join(60)
    return results


def _summary(results: list[tuple[float, int]]) -> dict:
    latencies = sorted(seconds for seconds, _ in results)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return {"sent": len(results), "503": sum(status == 503 for _, status in results),
            "other_errors": sum(status not in (202, 503) for _, status in results),
            "p50_ms": round(statistics.median(latencies) * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "max_ms": round(latencies[-1] * 1000, 1)}


def measure(database_url: str, folder: Path, reports: int, rate: float, seconds: float) -> dict:
    with FakeGitHub(tokens=("bench-github-token",)) as fake:
        env = {"RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_TOKEN": "bench-github-token", "RELAY_GITHUB_API_URL": fake.url,
               "RELAY_DATABASE_URL": database_url, "RELAY_BACKENDS_DIR": str(_backends(folder / "backends")),
               "RELAY_UPSTREAM_REPO": UPSTREAM, "RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0",
               "RELAY_CALLBACK_RATE_PER_MINUTE": "100000", "RELAY_CALLBACK_RATE_BURST": "1000",
               "RELAY_LOG_LEVEL": "WARNING"}
        relay = RelayProcess(env, folder / "relay.log").start()
        try:
            numbers = range(100, 100 + reports)
            for number in numbers:
                assert _webhook(relay.url, "pull_request", _pull_request(number), f"pr-{number}").status_code == 202
            deadline = time.monotonic() + 60
            while len(fake.dispatches(DOWNSTREAM)) < reports and time.monotonic() < deadline:
                time.sleep(0.05)
            nonces = [d["client_payload"]["nonce"] for d in fake.dispatches(DOWNSTREAM)
                      if d["client_payload"]["event"] == "pull_request"]
            assert len(nonces) == reports, f"{len(nonces)} of {reports} dispatches sent"
            for run_id, nonce in enumerate(nonces, 7000):
                started = _callback(relay.url, {"nonce": nonce, "state": "in_progress", "run_id": run_id, "run_attempt": 1,
                                                "run_url": f"https://github.com/{DOWNSTREAM}/actions/runs/{run_id}"})
                assert started.status_code == 200, started.text
            bodies = [{"nonce": nonce, "state": "completed", "run_id": run_id, "run_attempt": 1, "conclusion": "failure",
                       "report": _maximal_report(run_id)} for run_id, nonce in enumerate(nonces, 7000)]
            size = len(json.dumps(bodies[0]).encode())

            end = time.monotonic() + seconds
            alone = _webhooks_at_rate(relay.url, rate, lambda: time.monotonic() > end, f"alone-{uuid.uuid4().hex[:6]}")

            answers: list[int] = []
            senders = [threading.Thread(target=lambda b=b: answers.append(_callback(relay.url, b).status_code))
                       for b in bodies]
            for sender in senders:
                sender.start()
            under = _webhooks_at_rate(relay.url, rate, lambda: len(answers) == reports,
                                      f"under-{uuid.uuid4().hex[:6]}")
            for sender in senders:
                sender.join(300)
        finally:
            relay.stop()
    return {"report_bytes": size, "reports_answered": sorted(set(answers)), "alone": _summary(alone),
            "under_reports": _summary(under)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=8)
    parser.add_argument("--rate", type=float, default=20.0, help="webhooks per second (default 20)")
    parser.add_argument("--seconds", type=float, default=3.0, help="the baseline phase's length (default 3)")
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="intake-under-reports-") as tmp:
        stores = {"sqlite": f"sqlite:///{Path(tmp) / 'relay.db'}", "postgresql": _postgres_url()}
        for name, url in stores.items():
            if url is None:
                continue
            try:
                result = measure(url, Path(tmp) / name, args.reports, args.rate, args.seconds)
            finally:
                if name == "postgresql":
                    _drop(url)
            figures[name] = result
            print(f"{name}: {args.reports} reports of {result['report_bytes'] / 1e6:.2f} MB, answered "
                  f"{result['reports_answered']}")
            for phase in ("alone", "under_reports"):
                s = result[phase]
                print(f"  {phase:14} {s['sent']:4} webhooks  503: {s['503']:3}  p50 {s['p50_ms']:7.1f} ms  "
                      f"p99 {s['p99_ms']:7.1f} ms  max {s['max_ms']:7.1f} ms")
    print(json.dumps({name: {"p99_ratio": round(r["under_reports"]["p99_ms"] / max(r["alone"]["p99_ms"], 0.1), 2),
                             "p99_ms": r["under_reports"]["p99_ms"], "503": r["under_reports"]["503"]}
                      for name, r in figures.items()}))


if __name__ == "__main__":
    main()
