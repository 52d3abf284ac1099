"""The reusable workflow and its example caller call the relay as it expects: YAML parsed, the callback
steps checked, and their jq bodies built for real and validated by the relay's callback schema."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from relay.callbacks import CallbackBody
from tests.relay.results_support import report

ROOT = Path(__file__).resolve().parents[2] / "workflows"


def load(name):
    data = yaml.safe_load((ROOT / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps():
    return load("conformance.yml")["jobs"]["conformance"]["steps"]


def test_reusable_workflow_shape():
    workflow = load("conformance.yml")
    assert "workflow_call" in workflow["on"]
    assert workflow["permissions"]["id-token"] == "write"
    env = workflow["jobs"]["conformance"]["env"]
    assert env["NONCE"] == "${{ github.event.client_payload.nonce }}"
    assert env["RELAY_CALLBACK_URL"].endswith("/github/callback")
    assert env["RUN_ID"] == "${{ github.run_id }}" and env["RUN_ATTEMPT"] == "${{ github.run_attempt }}"
    names = [s["name"] for s in steps()]
    first, suite, last = names.index("Report in_progress to the relay"), names.index("Run the conformance suite"), \
        names.index("Report completed to the relay")
    assert first < suite < last
    assert "--report report.json" in steps()[suite]["run"]
    assert steps()[last]["if"] == "always()"
    for index in (first, last):
        script = steps()[index]["run"]
        assert "audience=$RELAY_AUDIENCE" in script and 'Authorization: Bearer $token' in script
        assert "Content-Type: application/json" in script and '"$RELAY_CALLBACK_URL"' in script


def test_example_caller_listens_for_the_relay_event_types():
    from relay.events import event_type, normalise
    from tests.relay.helpers import pr_payload

    caller = load("example-caller.yml")
    types = caller["on"]["repository_dispatch"]["types"]
    for action in ("opened", "synchronize", "reopened", "labeled"):
        kwargs = {"label": "x"} if action == "labeled" else {}
        assert event_type(normalise("pull_request", "d", pr_payload(action, **kwargs))) in types
    assert caller["permissions"]["id-token"] == "write"
    assert caller["jobs"]["conformance"]["uses"].endswith("conformance.yml@main")


def _body_from(step_script: str, tmp_path: Path, env: dict) -> dict:
    """Run the step's jq command (not curl) and return the JSON body it writes."""
    lines = step_script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(("jq -n", "case ")))
    end = next(i for i, line in enumerate(lines) if "> callback.json" in line)
    script = "\n".join(lines[start:end + 1])
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**os.environ, **env}, check=True)
    import json

    return json.loads((tmp_path / "callback.json").read_text())


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed (GitHub's runners have it)")
@pytest.mark.parametrize("outcome,job,with_report,conclusion", [
    ("success", "success", True, "success"), ("failure", "failure", True, "failure"),
    ("cancelled", "cancelled", False, "cancelled"), ("skipped", "failure", False, "failure"),
])
def test_callback_bodies_follow_the_relay_schema(tmp_path, outcome, job, with_report, conclusion):
    import json

    env = {"NONCE": "n" * 32, "RUN_ID": "123456", "RUN_ATTEMPT": "2", "RUN_URL": "https://github.com/o/r/actions/runs/123456",
           "OUTCOME": outcome, "JOB_STATUS": job}
    started = CallbackBody.model_validate(_body_from(steps()[0]["run"], tmp_path, env))
    assert (started.state, started.run_id, started.run_attempt) == ("in_progress", 123456, 2)
    if with_report:
        (tmp_path / "report.json").write_text(json.dumps(report("cpu")))
    done = CallbackBody.model_validate(_body_from(steps()[-1]["run"], tmp_path, env))
    assert (done.state, done.conclusion, done.nonce) == ("completed", conclusion, "n" * 32)
    assert (done.report is not None) == with_report
