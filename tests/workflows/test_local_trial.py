"""docs/onboarding.md's "Try it locally with act", run as written (issue 20): from a backend repository
whose descriptor is not packaged (an out-of-tree ``npu`` on CPU ranks), ``python -m
relay.testing.local_trial`` plays the relay and GitHub on loopback, act runs the repository's caller
with the reusable workflow of this checkout, and the result reaches the PR."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from relay.testing.github_openapi import default_description

ROOT = Path(__file__).resolve().parents[2]
ONBOARDING = ROOT / "docs" / "onboarding.md"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(default_description() is None,
                       reason="GitHub's REST description is not installed: npm install --prefix .octokit @octokit/openapi "
                              "(.ci/run does), or set GITHUB_OPENAPI_DESCRIPTION"),
]


def documented_commands() -> str:
    """The shell block right after the ``<!-- local-trial -->`` marker of the onboarding guide."""
    found = re.search(r"<!-- local-trial -->\n```sh\n(.*?)```", ONBOARDING.read_text(), re.S)
    assert found, "docs/onboarding.md lost its local-trial block"
    return found.group(1)


def backend_repository(root: Path) -> Path:
    """A backend repository as onboarding has it: the example caller copied unmodified, and its own descriptor."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "remote", "add", "origin", "https://github.com/local/npu-ci"], check=True)
    (root / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / "workflows" / "examples" / "crcr.yml", root / ".github" / "workflows" / "crcr.yml")
    descriptor = yaml.safe_load((ROOT / "backends" / "cpu.yaml").read_text())
    descriptor.update(name="npu", description="an out-of-tree backend for the trial (CPU ranks, gloo)")
    (root / "backends").mkdir()
    (root / "backends" / "npu.yaml").write_text(yaml.safe_dump(descriptor, sort_keys=False))
    return root


def test_the_onboarding_trial_runs_as_written_and_reaches_the_pr(tmp_path):
    repo = backend_repository(tmp_path / "npu-ci")
    workdir = tmp_path / "trial"
    commands = documented_commands().replace("/tmp/crcr-trial", str(workdir))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "ready: relay http://127.0.0.1:" in out
    assert "descriptor npu: cpu over gloo, from" in out  # the job loaded the repository's own descriptor
    assert "the trial keeps the torch installed here" in out and "keeping the installed torch" in out
    assert re.search(r"run \d+ of npu: completed \(success\); the PR shows crcr/npu success: 1 passed", out), out[-3000:]
    workflow = yaml.safe_load((workdir / "crcr.yml").read_text())["jobs"]["conformance"]["with"]
    assert (workflow["descriptor"], workflow["backend"], workflow["suites"]) == ("backends/npu.yaml", "npu", "collectives")
