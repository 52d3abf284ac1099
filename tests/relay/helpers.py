"""Helpers of the relay tests: signing, synthetic payloads, backend descriptors, a served relay app."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from relay.testing.relay_process import RelayProcess, free_port  # noqa: F401 (the tests' served relay)
from relay.testing import loopback_client

PAYLOADS_DIR = Path(os.environ.get("RELAY_TEST_PAYLOADS_DIR") or Path(__file__).resolve().parents[3] / "shared" / "github-payloads")
SECRET = "test-secret"
UPSTREAM = "pytorch/pytorch"

# Short timings so that retries and leases happen within a test's second or two. The poll is not short: it
# only finds what another process changed, as everything this relay does wakes its dispatcher, and 20 idle
# passes a second of every relay alive cost tests/relay a tenth of its CPU.
FAST = dict(
    dispatch_poll_seconds=0.5,
    dispatch_backoff_base_seconds=0.05,
    dispatch_backoff_max_seconds=0.2,
    dispatch_lease_seconds=5.0,
    github_timeout_seconds=2.0,
    github_secondary_backoff_seconds=0.2,
    github_content_requests_per_minute=0,
)


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def write_backend(folder: Path, name: str, repository: str | None, level: str | None, label: str | None = None) -> Path:
    lines = [
        f"name: {name}", "device_type: cpu", "detect: {accelerator: none}", "distributed_backend: gloo",
        "capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, "
        "symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}",
    ]
    if repository is not None:
        relay = f"relay: {{repository: {repository}, level: {level}"
        relay += f", label: '{label}'}}" if label else "}"
        lines.append(relay)
    path = folder / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def pr_payload(action: str = "opened", *, number: int = 7, labels: tuple[str, ...] = (), label: str | None = None,
               repository: str = UPSTREAM, head_sha: str = "a" * 40, body: str = "PR description",
               updated_at: str = "2024-05-01T10:00:00Z") -> dict[str, Any]:
    """A pull_request webhook with the fields GitHub sends that the relay reads (plus a body)."""
    payload: dict[str, Any] = {
        "action": action,
        "number": number,
        "pull_request": {
            "number": number, "state": "open", "title": "Fix things", "body": body, "draft": False,
            "html_url": f"https://github.com/{repository}/pull/{number}", "updated_at": updated_at,
            "labels": [{"name": name, "color": "ededed"} for name in labels],
            "head": {"sha": head_sha, "ref": "feature", "repo": {"full_name": "someone/fork"}},
            "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": repository}},
        },
        "repository": {"full_name": repository, "name": repository.split("/")[1]},
        "sender": {"login": "octocat"},
    }
    if label is not None:
        payload["label"] = {"name": label}
    return payload


def push_payload(*, repository: str = UPSTREAM, ref: str = "refs/heads/main", after: str = "c" * 40,
                 deleted: bool = False) -> dict[str, Any]:
    return {
        "ref": ref, "before": "d" * 40, "after": after, "created": False, "deleted": deleted, "forced": False,
        "base_ref": None, "commits": [], "repository": {"full_name": repository}, "sender": {"login": "octocat"},
    }


def new_delivery(delivery_id: str):
    """A push delivery to write straight into a store."""
    from relay.store import NewDelivery

    return NewDelivery(delivery_id=delivery_id, event="push", action=None, repository=UPSTREAM,
                       outcome="dispatched", summary={"head_sha": "c" * 40})


def new_dispatches(delivery_id: str, backends=("a", "b"), nonce: str | None = None) -> list:
    """One outbox row per backend (``org/<backend>``); nonces ``<delivery>-<backend>`` unless ``nonce`` is given."""
    from relay.store import NewDispatch

    return [NewDispatch(backend=b, repository=f"org/{b}", event_type="push", client_payload={"delivery": delivery_id},
                        nonce=nonce or f"{delivery_id}-{b}") for b in backends]


class _PromptServer(uvicorn.Server):
    """uvicorn's server whose main loop ends as soon as ``stop_soon`` is called: uvicorn's own looks at
    ``should_exit`` every 0.1 s, 0.05 s of idle at the end of every relay test on average."""

    _loop: asyncio.AbstractEventLoop | None = None
    _stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):  # uvicorn's tick (date header, request limit, should_exit)
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.1)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown without its fixed 0.1 s pause after asking the open connections to close
        (0.1 s at the end of every relay test): stop listening, ask each connection to close, wait
        until none is left and no request task runs, then the app's lifespan shutdown."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            await asyncio.sleep(0.005)
        if not self.force_exit:
            await self.lifespan.shutdown()

    def stop_soon(self) -> None:
        self.should_exit = True  # seen by the first tick if the main loop has not started yet
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the server has stopped already
                loop.call_soon_threadsafe(stopping.set)


@dataclasses.dataclass
class RelayUnderTest:
    """A relay app served by uvicorn on 127.0.0.1 in this process (real HTTP), with its fake GitHub."""

    app: Any
    server: _PromptServer
    thread: threading.Thread
    url: str
    fake: Any

    @classmethod
    def start(cls, database_url: str, fake, backends_dir: Path, **overrides) -> "RelayUnderTest":
        from relay import create_app, load_settings

        values = dict(
            webhook_secrets=SECRET, upstream_repo=UPSTREAM, github_api_url=fake.url, github_token="test-token",
            database_url=database_url, backends_dir=str(backends_dir), log_level="WARNING", **FAST,
        )
        values.update(overrides)
        app = create_app(load_settings(**values))
        server = _PromptServer(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
        thread = threading.Thread(target=server.run, name="relay-under-test", daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the relay did not start")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        return cls(app=app, server=server, thread=thread, url=f"http://127.0.0.1:{port}", fake=fake)

    def stop(self) -> None:
        self.server.stop_soon()
        self.thread.join(30)

    @property
    def parts(self):
        from relay.assembly import parts_of

        return parts_of(self.app)

    @property
    def store(self):
        return self.parts.store

    def post(self, event: str, payload: dict | bytes, *, delivery: str | None = None, secret: str = SECRET,
             headers: dict[str, str] | None = None) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        sent = {
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(body, secret), "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/test",
        }
        sent.update(headers or {})
        return loopback_client().post(f"{self.url}/github/webhook", content=body, headers={k: v for k, v in sent.items() if v is not None},
                          timeout=30)

    def wait_settled(self, timeout: float = 30.0) -> dict[str, int]:
        """Wait until no dispatch is queued or sending; returns the outbox depth.

        The bound only ends a stuck test: it is generous because a loaded 2-core machine (CI runs
        ranks beside these tests) can take seconds to schedule the dispatcher and its retries.
        """
        deadline = time.monotonic() + timeout
        while True:
            depth = self.store.outbox_depth()
            if depth["queued"] == 0 and depth["sending"] == 0:
                return depth
            if time.monotonic() > deadline:
                raise AssertionError(f"outbox did not settle in {timeout}s: {depth}")
            time.sleep(0.02)
