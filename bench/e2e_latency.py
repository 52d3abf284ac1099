"""Benchmark: the relay's own latency around a downstream run, suite time excluded.

One ``relay serve`` (SQLite, default settings), the fake GitHub and the fake OIDC issuer on loopback
(the same loop the act end-to-end tests use). For each of N signed pull_request webhooks (GitHub's own
sample, a new head commit each time), one after another:

* ``webhook->dispatch``: from sending the webhook to the fake GitHub holding its repository_dispatch;
* ``callback->status``: from the ``completed`` callback (sent by ``conformance callback``, OIDC token
  fetched from the fake issuer, a report of the dispatched torch) to the final commit status upstream.

The ``in_progress`` callback is sent in between and not timed. Baseline, in the same run: one loopback
HTTP round trip to the fake GitHub (what any relay must pay at least once per leg).

    python bench/e2e_latency.py [--events 100]

Prints p50/p99 per leg and ends with one JSON line ``{"name", "figures", "ratio"}``: each leg's ratio
is its p50 over the baseline's p50; ``ratio`` is callback->status's. The relay runs with its default
settings except GitHub's content-creation pacing (80 a minute), which would measure GitHub's limit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.e2e_loop import AUDIENCE, BACKEND, BACKEND_REPO, Loop  # noqa: E402
from conformance.callback import build_parser, run_callback  # noqa: E402
from relay.testing.sample_report import conformance_report  # noqa: E402

# GitHub's sample webhook payloads (the relay's tests read them from the same place).
PAYLOADS_DIR = Path(os.environ.get("RELAY_TEST_PAYLOADS_DIR") or ROOT.parent / "shared" / "github-payloads")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.perf_counter() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.perf_counter() > deadline:
            raise TimeoutError("the relay did not get there in time")
        time.sleep(0.001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100)
    args = parser.parse_args()
    sample = PAYLOADS_DIR / "pull_request__opened.payload.json"
    if not sample.is_file():
        print(f"needs GitHub's sample payloads at {PAYLOADS_DIR} (set RELAY_TEST_PAYLOADS_DIR)", file=sys.stderr)
        return 2
    webhook = json.loads(sample.read_text())
    with tempfile.TemporaryDirectory(prefix="e2e-latency-") as work:
        loop = Loop(Path(work), upstream=webhook["repository"]["full_name"], fast=False)
        try:
            baseline = []
            with httpx.Client() as client:
                for _ in range(args.events):
                    start = time.perf_counter()
                    client.get(f"{loop.fake.url}/repos/{BACKEND_REPO}", headers={"Authorization": "token e2e-github-token"})
                    baseline.append(time.perf_counter() - start)
            to_dispatch, to_status = [], []
            for index in range(args.events):
                sha = f"{index + 1:040x}"
                webhook["number"] = webhook["pull_request"]["number"] = 1000 + index
                webhook["pull_request"]["head"]["sha"] = sha
                start = time.perf_counter()
                delivery = loop.webhook("pull_request", webhook)
                dispatch = wait_for(lambda: next((d for d in loop.fake.dispatches(BACKEND_REPO)
                                                  if d["client_payload"]["delivery"] == delivery), None))
                to_dispatch.append(time.perf_counter() - start)

                env = {"RELAY_CALLBACK_URL": f"{loop.relay.url}/github/callback", "RELAY_AUDIENCE": AUDIENCE,
                       "NONCE": dispatch["client_payload"]["nonce"], "RUN_ID": str(index + 1), "RUN_ATTEMPT": "1",
                       "RELAY_CALLBACK_ALLOW_HTTP_LOOPBACK": "1",  # the relay is on 127.0.0.1, plain http
                       **loop.issuer.actions_token_env(BACKEND_REPO, run_id=index + 1)}
                report_path = Path(work) / "report.json"
                report_path.write_text(json.dumps(conformance_report(BACKEND, git_version=sha)))
                devnull = open(os.devnull, "w")
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    assert run_callback(build_parser().parse_args(["in-progress"]), env) == 0
                    start = time.perf_counter()
                    assert run_callback(build_parser().parse_args(
                        ["completed", "--suite-outcome", "success", "--job-status", "success",
                         "--report", str(report_path)]), env) == 0
                finally:
                    sys.stdout = stdout
                    devnull.close()
                wait_for(lambda: any(s["sha"] == sha and s["state"] != "pending" for s in loop.fake.statuses))
                to_status.append(time.perf_counter() - start)
        finally:
            loop.close()
    base = statistics.median(baseline)
    print(f"{'leg':20} {'p50 ms':>8} {'p99 ms':>8}   over {args.events} events")
    figures = {"events": args.events, "baseline_p50_ms": round(base * 1000, 2)}
    for name, values in (("webhook->dispatch", to_dispatch), ("callback->status", to_status), ("baseline", baseline)):
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"{name:20} {p50 * 1000:8.1f} {p99 * 1000:8.1f}")
        if name != "baseline":
            key = name.replace("->", "_to_")
            figures.update({f"{key}_p50_ms": round(p50 * 1000, 1), f"{key}_p99_ms": round(p99 * 1000, 1),
                            f"{key}_ratio": round(p50 / base, 1)})
    print(json.dumps({"name": "e2e_latency", "figures": figures, "ratio": figures["callback_to_status_ratio"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
