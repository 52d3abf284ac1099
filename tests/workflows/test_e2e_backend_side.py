"""End to end, the backend repository's side (issue 20): for a backend whose descriptor is not packaged (an
out-of-tree, PrivateUse1-style ``npu`` mapped onto CPU ranks, run from its own repository's descriptor),
every failure before the suite reaches the relay with the step that failed and its last lines: an
install that fails, a torch that does not import, a descriptor that does not load, and a job cancelled
while torch installs. Its passing run is test_local_trial.py's, through the onboarding guide's commands. act runs the example caller and the reusable workflow of this checkout, with the
offline stand-ins of ``workflows/act/`` for GitHub's own actions; the relay is a real ``relay serve``."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml

from bench.e2e_loop import ROOT, Loop
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
    return httpx.get(f"{loop.relay.url}/api/runs/{run['run']}", timeout=10).json()


def test_an_install_that_fails_reaches_the_pr_with_its_step_and_last_lines(loop, tmp_path):
    sha = "1" * 40
    constraint = tmp_path / "constraints.txt"
    constraint.write_text("numpy==0.0.1\n")  # the suite's dependencies cannot resolve
    act = run_npu(loop, dispatch_for_npu(loop, 202, sha), "install-fails", env={"PIP_CONSTRAINT": str(constraint)})
    assert act.returncode != 0
    run = ended_run(loop, 202)
    assert (run["state"], run["conclusion"]) == ("completed", "failure"), run
    assert run["reason"].startswith("step 'install-conformance' failed before the suite ran; its last lines:")
    assert "numpy" in run["reason"], run["reason"]
    assert final_status(loop, sha)["state"] == "failure"


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
    assert "torch does not import: ImportError: this torch build is broken" in run["reason"]
    assert final_status(loop, sha)["state"] == "failure"


def test_a_descriptor_that_does_not_load_is_reported(loop):
    sha = "3" * 40
    act = run_npu(loop, dispatch_for_npu(loop, 204, sha), "descriptor-broken",
                  descriptor="name: npu\nworld_size: many\n")
    assert act.returncode != 0
    run = ended_run(loop, 204)
    assert run["conclusion"] == "failure"
    assert run["reason"].startswith("step 'load-descriptor' failed before the suite ran")
    assert "npu.yaml" in run["reason"] and "world_size" in run["reason"], run["reason"]


def test_a_job_cancelled_while_torch_installs_is_reported_with_that_step(loop):
    sha = "4" * 40

    def installing_torch(log: str) -> bool:
        return "Install torch with the backend's command" in log and "sleeping for torch" in log

    act = run_npu(loop, dispatch_for_npu(loop, 205, sha), "cancel-install",
                  inputs={"torch-install": "echo sleeping for torch; sleep 120"}, interrupt_when=installing_torch)
    assert act.returncode != 0
    run = ended_run(loop, 205)
    assert run["state"] == "cancelled", run
    assert run["reason"].startswith("step 'install-torch' was cancelled before the suite ran"), run["reason"]
    assert "sleeping for torch" in run["reason"]
