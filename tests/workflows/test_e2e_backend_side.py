"""End to end, the backend repository's side (issue 20): for a backend whose descriptor is not packaged (an
out-of-tree, PrivateUse1-style ``npu`` mapped onto CPU ranks, run from its own repository's descriptor),
every failure before the suite reaches the relay and the PR with the step that failed and its last
lines: an install of the package that fails (reported by its callback client run from source), a torch
that does not import, a descriptor that does not load, and a job cancelled in each step before the suite.
Its passing run is test_local_trial.py's, through the onboarding guide's commands. act runs the example
caller and the reusable workflow of this checkout, with the offline stand-ins of ``workflows/act/`` for
GitHub's own actions; the relay is a real ``relay serve``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from bench.e2e_loop import ROOT, Loop
from relay.testing.local_trial import offline_job_env
from relay.testing import loopback_client
from tests.workflows.act_support import ACT_MARKS, real_pr_webhook, upstream_repository

pytestmark = ACT_MARKS

NPU, NPU_REPO = "npu", "org/npu-ci"


def npu_descriptor() -> dict:
    """The cpu descriptor under another name: a backend the package does not ship, on CPU ranks."""
    descriptor = yaml.safe_load((ROOT / "backends" / "cpu.yaml").read_text())
    descriptor["name"], descriptor["description"] = NPU, "an out-of-tree backend for the test (CPU ranks, gloo)"
    return descriptor


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    upstream = upstream_repository()
    allowlisted = {**npu_descriptor(), "relay": {"repository": NPU_REPO, "level": "L4"}}
    loop = Loop(tmp_path_factory.mktemp("e2e-backend-side"), upstream=upstream, extra_backends={NPU: allowlisted})
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def _every_call_to_github_fits_its_description(loop):
    yield
    assert loop.fake.schema_violations == []


def dispatch_for_npu(loop: Loop, number: int, head_sha: str) -> dict:
    return loop.dispatch_of(loop.webhook("pull_request", real_pr_webhook(number, head_sha)), repo=NPU_REPO)


def run_npu(loop: Loop, dispatch: dict, name: str, *, descriptor: str | None = None, inputs: dict | None = None,
            **kwargs):
    files = {"backends/npu.yaml": descriptor if descriptor is not None else yaml.safe_dump(npu_descriptor())}
    return loop.act(dispatch, name=name, backend=NPU, backend_repo=NPU_REPO, files=files,
                    inputs={"descriptor": "backends/npu.yaml", **(inputs or {})}, **kwargs)


def final_status(loop: Loop, sha: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [s for s in loop.fake.statuses if s["context"] == f"crcr/{NPU}" and s["sha"] == sha
                and s["state"] != "pending"]
        if done:
            return done[-1]
        time.sleep(0.05)
    raise AssertionError(f"no final crcr/{NPU} status on {sha}")


def ended_run(loop: Loop, number: int) -> dict:
    run = loop.wait_run(number, lambda r: r["state"] not in ("dispatched", "in_progress"), "the end of the run",
                        backend=NPU)
    return loopback_client().get(f"{loop.relay.url}/api/runs/{run['run']}", timeout=10).json()


def test_an_install_that_fails_reaches_the_pr_with_its_step_and_last_lines(loop, tmp_path):
    sha = "1" * 40
    constraint = tmp_path / "constraints.txt"
    constraint.write_text("pydantic==0.0.1\n")  # the package's own dependency: nothing installs
    act = run_npu(loop, dispatch_for_npu(loop, 202, sha), "install-fails", env={"PIP_CONSTRAINT": str(constraint)})
    assert act.returncode != 0
    assert "the conformance package did not install: reporting with its callback client from source" in act.log
    run = ended_run(loop, 202)
    assert (run["state"], run["conclusion"]) == ("completed", "failure"), run
    assert run["reason"].startswith("step 'install-conformance' failed before the suite ran; its last lines:")
    assert "pydantic" in run["reason"], run["reason"]
    status = final_status(loop, sha)
    assert status["state"] == "failure"
    assert status["description"].startswith("no report: step 'install-conformance' failed before the suite ran"), status


def test_a_torch_that_does_not_import_ends_the_job_before_the_suite(loop):
    sha = "2" * 40
    broken = ('mkdir -p "$RUN_DIR/broken/torch" && '
              'echo "raise ImportError(\'this torch build is broken\')" > "$RUN_DIR/broken/torch/__init__.py" && '
              'echo "PYTHONPATH=$RUN_DIR/broken:$PYTHONPATH" >> "$GITHUB_ENV"')
    act = run_npu(loop, dispatch_for_npu(loop, 203, sha), "torch-broken", inputs={"torch-install": broken})
    assert act.returncode != 0
    assert "Run Main Run the conformance suite" not in act.log, "the suite ran on a torch that does not import"
    run = ended_run(loop, 203)
    assert run["conclusion"] == "failure"
    assert run["reason"].startswith("step 'check-torch' failed before the suite ran")
    assert "conformance preflight: torch does not import: ImportError: this torch build is broken" in run["reason"]
    assert "::error::conformance preflight: torch does not import" in act.log  # an annotation on the run's page
    status = final_status(loop, sha)
    assert status["state"] == "failure"
    assert status["description"].startswith("no report: step 'check-torch' failed before the suite ran"), status


def test_a_descriptor_that_does_not_load_is_reported(loop):
    sha = "3" * 40
    act = run_npu(loop, dispatch_for_npu(loop, 204, sha), "descriptor-broken",
                  descriptor="name: npu\nworld_size: many\n")
    assert act.returncode != 0
    run = ended_run(loop, 204)
    assert run["conclusion"] == "failure"
    assert run["reason"].startswith("step 'load-descriptor' failed before the suite ran")
    assert "npu.yaml" in run["reason"] and "world_size" in run["reason"], run["reason"]
    assert final_status(loop, sha)["description"].startswith(
        "no report: step 'load-descriptor' failed before the suite ran")


def hang_in_step(folder: Path) -> Path:
    """A ``sitecustomize`` that holds any Python the job starts in the step whose id is ``$HANG_IN_STEP``
    (``GITHUB_ACTION`` is the step's id): pip, ``conformance preflight`` or a torch install alike."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import os, time\n"
        "if os.environ.get('GITHUB_ACTION') == os.environ.get('HANG_IN_STEP'):\n"
        "    print('hanging in', os.environ['GITHUB_ACTION'], flush=True)\n"
        "    time.sleep(300)\n")
    return folder


@pytest.mark.parametrize("number,step", [
    (205, "install-conformance"),  # nothing installed yet: the callback client runs from source
    (206, "load-descriptor"),
    (207, "install-torch"),
    (208, "check-torch"),
])
def test_a_job_cancelled_in_a_step_before_the_suite_is_reported_with_that_step(loop, tmp_path, number, step):
    sha = f"{number:x}".ljust(40, "4")
    hang = hang_in_step(tmp_path / "hang")
    env = {"HANG_IN_STEP": step, "PYTHONPATH": f"{hang}:{offline_job_env(tmp_path)['PYTHONPATH']}"}
    act = run_npu(loop, dispatch_for_npu(loop, number, sha), f"cancel-{step}", env=env,
                  interrupt_when=lambda log: f"hanging in {step}" in log)
    assert act.returncode != 0
    run = ended_run(loop, number)
    assert run["state"] == "cancelled", run
    assert run["reason"].startswith(f"step '{step}' was cancelled before the suite ran; its last lines:"), run["reason"]
    assert f"hanging in {step}" in run["reason"]
    assert final_status(loop, sha)["description"].startswith(
        f"cancelled: step '{step}' was cancelled before the suite ran"), final_status(loop, sha)
