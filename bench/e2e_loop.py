"""The whole loop on one machine, for the end-to-end tests and the latency benchmark: a real
``relay serve`` (SQLite), the fake GitHub (request bodies checked against GitHub's OpenAPI
description when it is installed), the fake OIDC issuer as the runner's token service, a proxy in
front of the relay that can answer 503, and ``act`` running the example caller, which calls the
reusable workflow from this checkout (``--local-repository``).

The act job runs on this host (``-P ubuntu-latest=-self-hosted``): no Docker, no network. Its Python
environment is the tests' own: the job's fresh virtual environment sees the installed packages
through ``PYTHONPATH`` (a runner image with torch and the suite's dependencies preinstalled), pip
never reaches an index (``PIP_NO_INDEX``), and the conformance package itself is built from this
checkout, as the workflow does from its own commit.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import hmac
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives import serialization

from relay.testing import FakeGitHub
from relay.testing.flaky_proxy import FlakyProxy
from relay.testing.local_trial import KEEP_INSTALLED_TORCH, act_command, offline_job_env
from relay.testing.oidc_issuer import FakeOidcIssuer, new_rsa_key

ROOT = Path(__file__).resolve().parents[1]
CALLER = ROOT / "workflows" / "examples" / "crcr.yml"
BACKEND = "cpu"
BACKEND_REPO = "org/cpu-ci"
AUDIENCE = "crcr-e2e"
SECRET = "e2e-webhook-secret"
GITHUB_TOKEN = "e2e-github-token"
# A quick subset: SUM passes on gloo, PREMUL_SUM is a known failure (xfail) of the cpu descriptor.
SUITE, SELECT = "collectives", "test_all_reduce[ and float32 and SUM"
PREMUL = "collectives::test_all_reduce[PREMUL_SUM-float32]"


def torch_git_version() -> str:
    """The commit the installed torch was built from, as its ``torch/version.py`` records it: read, not
    imported (an import of torch costs this process, or a child, seconds of CPU)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"torch is not installed for {sys.executable}")
    version_py = Path(spec.submodule_search_locations[0]) / "version.py"
    for node in ast.parse(version_py.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if getattr(target, "id", None) == "git_version" and isinstance(node.value, ast.Constant):
            return node.value.value
    raise RuntimeError(f"{version_py} assigns no git_version")


def sign(body: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def relay_backends(folder: Path, level: str = "L4", extra: dict[str, dict] | None = None) -> Path:
    """The packaged cpu descriptor with a relay section: the relay's allowlist for the act job's repository;
    ``extra`` adds descriptors by name (each with its own relay section)."""
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = yaml.safe_load((ROOT / "backends" / "cpu.yaml").read_text())
    descriptor["relay"] = {"repository": BACKEND_REPO, "level": level}
    (folder / "cpu.yaml").write_text(yaml.safe_dump(descriptor, sort_keys=False))
    for name, other in (extra or {}).items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    return folder


def without_known_failure(folder: Path, match: str) -> Path:
    """A descriptor directory whose cpu descriptor lacks the known failure ``match``: that test fails for real."""
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = yaml.safe_load((ROOT / "backends" / "cpu.yaml").read_text())
    before = len(descriptor["known_failures"])
    descriptor["known_failures"] = [k for k in descriptor["known_failures"] if k["match"] != match]
    assert len(descriptor["known_failures"]) == before - 1, f"no known failure {match!r} in backends/cpu.yaml"
    (folder / "cpu.yaml").write_text(yaml.safe_dump(descriptor, sort_keys=False))
    return folder


def end_processes_working_in(*folders: Path) -> list[int]:
    """SIGKILL every process (not this one) whose working directory is one of ``folders`` or below it; their
    pids. Linux's ``/proc``; elsewhere nothing is found."""
    roots, ended = [Path(folder).resolve() for folder in folders], []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone, or not ours to read
            continue
        if any(cwd == root or root in cwd.parents for root in roots):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                ended.append(int(entry.name))
            except ProcessLookupError:
                pass
    return ended


@dataclasses.dataclass
class ActRun:
    returncode: int
    log: str


class Loop:
    """One relay with its fakes, and a way to run the backend's workflow with act for a dispatch."""

    def __init__(self, work: Path, *, upstream: str, app_mode: bool = False, fast: bool = True,
                 extra_backends: dict[str, dict] | None = None):
        """``fast``: short dispatcher and label polls (tests); off, the relay's defaults (benchmarks).
        ``extra_backends``: more descriptors in the relay's allowlist, by name."""
        self.work = work
        self.upstream = upstream
        self.fake = FakeGitHub(tokens=(GITHUB_TOKEN,)).start()
        assert self.fake.openapi is not None, "GitHub's REST description is not installed (see relay/testing/github_openapi.py)"
        self.issuer = FakeOidcIssuer().start()
        self.relay_log = work / "relay.log"
        env = {
            "RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_API_URL": self.fake.url,
            "RELAY_DATABASE_URL": f"sqlite:///{work / 'relay.db'}", "RELAY_BACKENDS_DIR": str(relay_backends(work / "allowlist", extra=extra_backends)),
            "RELAY_UPSTREAM_REPO": upstream, "RELAY_OIDC_ISSUER": self.issuer.url, "RELAY_OIDC_AUDIENCE": AUDIENCE,
            "RELAY_DASHBOARD_URL": "http://dashboard.e2e", "RELAY_LOG_LEVEL": "WARNING",
            "RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0",  # the fake has no content-creation limit
        }
        if fast:
            env.update(RELAY_DISPATCH_POLL_SECONDS="0.05", RELAY_DISPATCH_BACKOFF_BASE_SECONDS="0.05",
                       RELAY_LABEL_POLL_SECONDS="0.1")
        if app_mode:
            key = new_rsa_key()
            pem = work / "app.pem"
            pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
            self.fake.app_id = "4242"
            self.fake.app_public_key_pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            for repo in (upstream, BACKEND_REPO):
                self.fake.install_app(repo)
            env.update(RELAY_GITHUB_APP_ID="4242", RELAY_GITHUB_PRIVATE_KEY_FILE=str(pem))
        else:
            env["RELAY_GITHUB_TOKEN"] = GITHUB_TOKEN
        from relay.testing.relay_process import RelayProcess

        self.relay = RelayProcess(env, self.relay_log).start()
        self.proxy = FlakyProxy(self.relay.url).start()

    def close(self) -> None:
        self.proxy.stop()
        self.relay.stop()
        self.issuer.stop()
        self.fake.stop()

    # --- upstream ---------------------------------------------------------------------------------
    def webhook(self, event: str, payload: dict[str, Any]) -> str:
        """POST a signed webhook; returns its delivery id once the relay answered 2xx."""
        body = json.dumps(payload).encode()
        delivery = str(uuid.uuid4())
        answer = httpx.post(f"{self.relay.url}/github/webhook", content=body, timeout=30, headers={
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": sign(body),
            "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/e2e"})
        assert answer.status_code in (200, 202), answer.text
        return delivery

    def dispatch_of(self, delivery: str, timeout: float = 30, repo: str = BACKEND_REPO) -> dict[str, Any]:
        """The repository_dispatch body the fake GitHub recorded for ``delivery`` to ``repo``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for body in self.fake.dispatches(repo):
                if body["client_payload"]["delivery"] == delivery:
                    return body
            time.sleep(0.02)
        raise AssertionError(f"no dispatch of {delivery} to {repo} within {timeout} s: {self.relay_log.read_text()[-2000:]}")

    def run(self, pr_number: int) -> dict[str, Any]:
        """The PR page's API: the backend's runs on it (newest first)."""
        return httpx.get(f"{self.relay.url}/api/prs/{pr_number}", timeout=10).json()

    def wait_run(self, pr_number: int, predicate, what: str, timeout: float = 60,
                 backend: str = BACKEND) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = httpx.get(f"{self.relay.url}/api/prs/{pr_number}", timeout=10)
            if answer.status_code == 200:
                runs = answer.json()["runs"].get(backend) or []
                if runs and predicate(runs[0]):
                    return runs[0]
            time.sleep(0.05)
        raise AssertionError(f"PR {pr_number}: {what} not seen within {timeout} s")

    # --- downstream -------------------------------------------------------------------------------
    def act(self, dispatch: dict[str, Any], *, name: str, env: dict[str, str] | None = None,
            interrupt_when=None, timeout: float = 300, backend: str = BACKEND, backend_repo: str = BACKEND_REPO,
            inputs: dict[str, Any] | None = None, files: dict[str, str] | None = None) -> ActRun:
        """Run the example caller for ``dispatch`` with act; ``interrupt_when(log so far)`` true sends act SIGINT.

        ``backend``/``backend_repo``: the caller's backend input and its repository (the OIDC token's);
        ``inputs``: more inputs of the reusable workflow; ``files``: files of the caller's repository
        (e.g. its own descriptor), which the checkout stand-in copies into the job's workspace."""
        repo = self.work / name
        workflows = repo / ".github" / "workflows"
        workflows.mkdir(parents=True)
        caller = yaml.safe_load(CALLER.read_text())
        caller["on"] = caller.pop(True)  # YAML 1.1 reads the key `on` as True
        job = caller["jobs"]["conformance"]
        job["with"].update({
            "relay-url": self.proxy.url, "audience": AUDIENCE, "backend": backend,
            "descriptor": "",  # a packaged descriptor (cpu) unless ``inputs`` name the repository's own
            # The backend's install command: torch is preinstalled on this runner, and stays, as in the local trial.
            "torch-install": KEEP_INSTALLED_TORCH,
            "conformance-source": f"file://{ROOT}", "suites": SUITE, "select": SELECT,
            "python": sys.executable, "timeout-minutes": 15,
        })
        job["with"].update(inputs or {})
        (workflows / "crcr.yml").write_text(yaml.safe_dump(caller, sort_keys=False))
        for relative, content in (files or {}).items():
            (repo / relative).parent.mkdir(parents=True, exist_ok=True)
            (repo / relative).write_text(content)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", f"https://github.com/{backend_repo}"], check=True)
        event = self.work / f"{name}.event.json"
        event.write_text(json.dumps({"action": dispatch["event_type"], "client_payload": dispatch["client_payload"]}))

        token_env = self.issuer.actions_token_env(backend_repo, run_id=1)  # act numbers every run 1
        act = shutil.which("act", path=str(Path(sys.executable).parent)) or "act"
        command = act_command(act, event, workflows / "crcr.yml", job["uses"], ROOT,
                              {**token_env, **offline_job_env(repo), **(env or {})})
        home = self.work / "home"
        home.mkdir(exist_ok=True)
        venv_bin = str(Path(sys.executable).parent)
        process_env = {
            "PATH": ":".join(p for p in os.environ.get("PATH", "").split(":") if p and p != venv_bin),
            "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "LANG": "C.UTF-8",
        }
        log = self.work / f"{name}.act.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(command, cwd=repo, env=process_env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            deadline = time.monotonic() + timeout
            interrupted = False
            try:
                while process.poll() is None:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"act ran over {timeout} s: {log.read_text()[-3000:]}")
                    if interrupt_when is not None and not interrupted and interrupt_when(log.read_text(errors="replace")):
                        process.send_signal(signal.SIGINT)  # what a cancellation does to the runner
                        interrupted = True
                    time.sleep(0.05)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)
                # act leaves the processes of a step it cancelled running, each step in a session of its own (a
                # runner would end them): what still works in this run's repository or act's folders goes now.
                end_processes_working_in(repo, home)
        return ActRun(process.returncode, log.read_text(errors="replace"))
