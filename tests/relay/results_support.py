"""Support for the results-side tests: backends with callback tokens, a relay with OIDC on, conformance
reports, and a driver that takes one dispatch through its callbacks over real HTTP."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import httpx

from relay.testing.sample_report import conformance_report as report  # noqa: F401 (the results tests' report)
from relay.testing import loopback_client
from tests.relay.helpers import UPSTREAM, pr_payload, push_payload

AUDIENCE = "crcr-relay-test"
# Repositories of the backends_dir fixture's four backends; each gets a static callback token.
REPOS = {"l1": "org/l1-ci", "l2": "org/l2-ci", "l3": "org/l3-ci", "l4": "org/l4-ci"}
TOKENS = {name: f"static-token-{name}-0123456789abcdef" for name in REPOS}


def write_backends(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    caps = ("capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, "
            "symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}")
    for name, repo in REPOS.items():
        digest = hashlib.sha256(TOKENS[name].encode()).hexdigest()
        (folder / f"{name}.yaml").write_text(
            f"name: {name}\ndevice_type: cpu\ndetect: {{accelerator: none}}\ndistributed_backend: gloo\n{caps}\n"
            f"relay: {{repository: {repo}, level: {name.upper()}, callback_token_sha256: '{digest}'}}\n"
        )
    return folder


class Driver:
    """Drives a served relay (RelayUnderTest) through webhooks and callbacks."""

    def __init__(self, relay):
        self.relay = relay

    def open_pr(self, number: int = 7, *, labels: tuple[str, ...] = (), head_sha: str = "a" * 40,
                action: str = "opened", label: str | None = None, updated_at: str = "2024-05-01T10:00:00Z",
                title: str = "Fix things") -> str:
        payload = pr_payload(action, number=number, labels=labels, head_sha=head_sha, label=label, updated_at=updated_at)
        payload["pull_request"]["title"] = title
        delivery = str(uuid.uuid4())
        response = self.relay.post("pull_request", payload, delivery=delivery)
        assert response.status_code in (200, 202), response.text
        self.relay.wait_settled()
        return delivery

    def push(self, after: str = "c" * 40) -> str:
        delivery = str(uuid.uuid4())
        assert self.relay.post("push", push_payload(after=after), delivery=delivery).status_code == 202
        self.relay.wait_settled()
        return delivery

    def nonce(self, backend: str, delivery: str) -> str:
        payloads = [p["client_payload"] for p in self.relay.fake.dispatches(REPOS[backend])
                    if p["client_payload"]["delivery"] == delivery]
        assert payloads, f"no dispatch of {delivery} to {backend}"
        return payloads[-1]["nonce"]

    def callback(self, body: dict[str, Any], *, backend: str | None = None, auth: str | None = None,
                 headers: dict[str, str] | None = None, content: bytes | None = None) -> httpx.Response:
        sent = {"Content-Type": "application/json"}
        if auth is not None:
            sent["Authorization"] = auth
        elif backend is not None:
            sent["Authorization"] = f"Token {TOKENS[backend]}"
        sent.update(headers or {})
        return loopback_client().post(f"{self.relay.url}/github/callback", json=None if content is not None else body,
                          content=content, headers=sent, timeout=30)

    def start(self, backend: str, nonce: str, run_id: int = 5001, attempt: int = 1, **kw) -> httpx.Response:
        return self.callback({"nonce": nonce, "state": "in_progress", "run_id": run_id, "run_attempt": attempt,
                              "run_url": f"https://github.com/{REPOS[backend]}/actions/runs/{run_id}"}, backend=backend, **kw)

    def complete(self, backend: str, nonce: str, conclusion: str = "failure", run_id: int = 5001, attempt: int = 1,
                 report_body: dict | None = None, with_report: bool = True, **kw) -> httpx.Response:
        body = {"nonce": nonce, "state": "completed", "run_id": run_id, "run_attempt": attempt, "conclusion": conclusion}
        if with_report:
            body["report"] = report_body if report_body is not None else report(backend)
        return self.callback(body, backend=backend, **kw)


__all__ = ["AUDIENCE", "Driver", "REPOS", "TOKENS", "UPSTREAM", "report", "write_backends"]
