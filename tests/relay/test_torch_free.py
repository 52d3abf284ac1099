"""The relay imports, builds its app and serves a webhook with torch unavailable, and imports no
``conformance`` module except the torch-free descriptors, report schema and provenance rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.relay.helpers import write_backend

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test (tried to import {name})")
            return None

    sys.meta_path.insert(0, NoTorch())

    import hashlib, hmac, json, threading, time
    import httpx, uvicorn
    import relay
    from relay import create_app, load_settings
    from relay.testing import FakeGitHub

    fake = FakeGitHub().start()
    app = create_app(load_settings(
        webhook_secrets="s", github_token="test-token", github_api_url=fake.url, upstream_repo="pytorch/pytorch",
        database_url=sys.argv[1], backends_dir=sys.argv[2], dispatch_poll_seconds=0.05))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    body = json.dumps({"ref": "refs/heads/main", "before": "a" * 40, "after": "b" * 40,
                       "repository": {"full_name": "pytorch/pytorch"}, "sender": {"login": "x"}}).encode()
    answer = httpx.post(f"http://127.0.0.1:{port}/github/webhook", content=body, headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": "torch-free-1", "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + hmac.new(b"s", body, hashlib.sha256).hexdigest()})
    assert answer.status_code == 202, answer.text
    deadline = time.time() + 10
    while not fake.dispatches() and time.time() < deadline:
        time.sleep(0.02)
    assert len(fake.dispatches()) == 1
    server.should_exit = True
    thread.join()
    loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "conformance")))
    print("LOADED", json.dumps(loaded))
    """
)


def test_relay_runs_without_torch(tmp_path: Path):
    backends = tmp_path / "backends"
    backends.mkdir()
    write_backend(backends, "cpu", "org/cpu-ci", "L1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'relay.db'}", str(backends)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("LOADED "))
    loaded = set(__import__("json").loads(line[len("LOADED "):]))
    assert not any(name == "torch" or name.startswith("torch.") for name in loaded)
    assert loaded <= {"conformance", "conformance.descriptors", "conformance.report", "conformance.provenance"}, loaded
