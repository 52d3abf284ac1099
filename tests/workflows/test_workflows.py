"""The reusable workflow and its example caller: where GitHub looks for them, what the linters say
(zizmor's auditor persona, actionlint with shellcheck, GitHub's workflow schema), and the rules the
files must keep (values reach shell only through env, job-level permissions, bash, time limits,
one concurrency group for the run and its cancellation, a caller pinned by full commit SHA)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REUSABLE = ROOT / ".github" / "workflows" / "conformance.yml"
CALLER = ROOT / "workflows" / "examples" / "crcr.yml"
BIN = Path(sys.executable).parent


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `pip install -e .[dev]` installs it (see pyproject.toml's dev extra)")
    return found


def test_zizmor_auditor_persona_finds_nothing():
    result = subprocess.run([tool("zizmor"), "--offline", "--persona=auditor", "--no-progress", str(REUSABLE), str(CALLER)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_actionlint_with_shellcheck_finds_nothing():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed (Debian package shellcheck; .ci/run installs it)")
    result = subprocess.run([tool("actionlint"), "-shellcheck", shellcheck, str(REUSABLE), str(CALLER)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_does_report_a_shell_problem(tmp_path):
    """The lint test can fail: the same workflow with an unquoted variable in a script is refused."""
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(REUSABLE.read_text().replace('rm -rf "$run_dir"', "rm -rf $run_dir"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    result = subprocess.run([tool("actionlint"), "-shellcheck", shutil.which("shellcheck") or "shellcheck", str(broken)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1 and "SC2086" in result.stdout, result.stdout + result.stderr


def test_workflow_schema():
    result = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(REUSABLE),
                             str(CALLER)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _scripts(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            if "run" in step:
                yield job_name, step["name"], step["run"]


def test_values_reach_shell_only_through_env():
    for path in (REUSABLE, CALLER):
        for job, step, script in _scripts(load(path)):
            assert "${{" not in script, f"{path.name}: job {job}, step {step!r} interpolates into its script"


def test_reusable_workflow_is_where_github_runs_it_with_job_level_rules():
    workflow = load(REUSABLE)
    assert REUSABLE.parent == ROOT / ".github" / "workflows"  # GitHub runs reusable workflows from there only
    assert "workflow_call" in workflow["on"]
    assert workflow["permissions"] == {}  # nothing at workflow level: each job asks for its own
    jobs = workflow["jobs"]
    assert jobs["conformance"]["permissions"] == {"contents": "read", "id-token": "write"}
    assert jobs["cancel"]["permissions"] == {}
    for job in jobs.values():
        assert job["defaults"]["run"]["shell"] == "bash"  # GitHub's bash is -e -o pipefail
        assert "timeout-minutes" in job
        assert job["concurrency"]["cancel-in-progress"] is True
    # pull_request.closed cancels the run in flight because both jobs name the same group.
    assert jobs["conformance"]["concurrency"]["group"] == jobs["cancel"]["concurrency"]["group"]
    assert "closed" in jobs["cancel"]["if"] and "closed" in jobs["conformance"]["if"]


def test_dispatch_is_exported_as_env():
    env = load(REUSABLE)["jobs"]["conformance"]["env"]
    payload = "github.event.client_payload"
    assert env["HEAD_SHA"] == f"${{{{ {payload}.head.sha }}}}"
    assert env["BASE_SHA"] == f"${{{{ {payload}.base.sha }}}}"
    assert env["HEAD_REF"] == f"${{{{ {payload}.head.ref }}}}"
    assert env["PR_NUMBER"] == f"${{{{ {payload}.pull_request.number }}}}"
    assert env["NONCE"] == f"${{{{ {payload}.nonce }}}}"
    for name in ("EVENT", "ACTION", "DELIVERY", "RUN_ID", "RUN_ATTEMPT", "RELAY_CALLBACK_URL", "RELAY_AUDIENCE"):
        assert name in env


def test_step_order_and_the_final_callback_always_runs():
    steps = load(REUSABLE)["jobs"]["conformance"]["steps"]
    names = [s["name"] for s in steps]
    order = ["Prepare a run directory of this run alone", "Install the conformance package at this workflow's commit",
             "Report in_progress to the relay", "Run the conformance suite", "Report completed to the relay"]
    assert [n for n in names if n in order] == order
    by_name = {s["name"]: s for s in steps}
    assert by_name["Report in_progress to the relay"]["continue-on-error"] is True
    assert by_name["Report completed to the relay"]["if"] == "always()"
    prepare = by_name[order[0]]["run"]
    assert prepare.index('rm -rf "$run_dir"') < prepare.index('mkdir -p "$run_dir"')
    assert '"$REPORT"' in by_name["Run the conformance suite"]["run"]
    # Torch: the backend's command when given, else the source build at HEAD_SHA.
    assert by_name["Install torch with the backend's command"]["if"] == "inputs.torch-install != ''"
    assert by_name["Build torch from source at the dispatched commit"]["if"] == "inputs.torch-install == ''"
    assert '"$HEAD_SHA"' in by_name["Check out upstream torch at the dispatched commit"]["run"]
    cache = by_name["Restore the compiler cache of the base commit"]
    assert "client_payload.base.sha" in cache["with"]["key"]


def test_every_step_that_can_fail_before_the_suite_is_named_in_the_final_callback():
    """A step that fails (or is cancelled) before the suite is the reason the relay gets: each one after
    the run directory exists has an id, listed in STEP_OUTCOMES in step order (else its failure would
    read "the suite wrote no report"), and each that runs a script keeps its log for the reason's lines."""
    steps = load(REUSABLE)["jobs"]["conformance"]["steps"]
    names = [s["name"] for s in steps]
    before_suite = steps[1:names.index("Run the conformance suite")]
    can_fail = [s for s in before_suite if not s.get("continue-on-error")]
    assert all("id" in s for s in can_fail), [s["name"] for s in can_fail if "id" not in s]
    outcomes = re.findall(r"([\w-]+)=\$\{\{ steps\.([\w-]+)\.outcome }}", steps[-1]["env"]["STEP_OUTCOMES"])
    assert outcomes == [(s["id"], s["id"]) for s in can_fail]
    for step in can_fail:
        if "run" in step:
            assert f'exec > >(tee "$STEP_LOGS/{step["id"]}.log") 2>&1' in step["run"], step["name"]


def test_example_caller_pins_the_reusable_workflow_and_listens_for_every_relay_event():
    from relay.intake.events import event_type, normalise
    from tests.relay.helpers import pr_payload, push_payload

    caller = load(CALLER)
    uses = caller["jobs"]["conformance"]["uses"]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+/\.github/workflows/conformance\.yml@[0-9a-f]{40}", uses), uses
    assert re.search(r"conformance\.yml@[0-9a-f]{40} # v\d", CALLER.read_text()), "the pin needs a version comment"
    assert caller["permissions"] == {}
    assert caller["jobs"]["conformance"]["permissions"] == {"contents": "read", "id-token": "write"}
    types = caller["on"]["repository_dispatch"]["types"]
    for action in ("opened", "synchronize", "reopened", "labeled", "closed"):
        kwargs = {"label": "x"} if action == "labeled" else {}
        assert event_type(normalise("pull_request", "d", pr_payload(action, **kwargs))) in types
    assert event_type(normalise("push", "d", push_payload())) in types


def test_the_pinned_commit_has_every_input_the_example_and_the_guide_use():
    """The caller pins a commit of this repository's history (GitHub runs that commit's workflow, which
    refuses an input it does not declare); every input and secret the example caller (its commented
    ones too) and docs/onboarding.md name must be declared there. A release moves the pin forward."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)

    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone may lack the pinned commit: git fetch --unshallow")
    pin = load(CALLER)["jobs"]["conformance"]["uses"].rsplit("@", 1)[1]
    assert git("merge-base", "--is-ancestor", pin, "HEAD").returncode == 0, \
        f"the example caller pins {pin}, which is not in this branch's history"
    shown = git("show", f"{pin}:.github/workflows/conformance.yml")
    assert shown.returncode == 0, shown.stderr

    def interface(workflow: dict) -> set[str]:
        call = workflow["on"]["workflow_call"]
        return set(call["inputs"]) | set(call.get("secrets") or {})

    pinned = yaml.safe_load(shown.stdout)
    pinned["on"] = pinned.pop(True)
    names = interface(load(REUSABLE))
    used = set(load(CALLER)["jobs"]["conformance"]["with"])
    used |= set(re.findall(r"^\s*# ([\w-]+): ", CALLER.read_text(), re.M)) & names  # commented out: torch-install
    guide = (ROOT / "docs" / "onboarding.md").read_text()
    used |= {name for name in names if f"`{name}`" in guide or f"{name}: " in guide}
    assert {"descriptor", "torch-install", "callback-token"} <= used  # the probe sees what the guide names
    missing = used - interface(pinned)
    assert not missing, f"the example caller pins {pin[:12]}, whose workflow lacks {sorted(missing)}: pin a newer commit"



def test_every_step_that_keeps_a_log_has_written_all_of_it_when_it_exits(tmp_path):
    """A step tees its output into ``$STEP_LOGS`` through a process substitution, which outlives the step's
    shell: the step must wait for it, or the report step may read a log without the error that failed the
    step (seen as a run whose reason lacked the descriptor's error). Each step's own opening lines run here
    under bash -e, with a ``tee`` that takes its time, and a failure right after."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "tee").write_text(f"#!/bin/sh\nsleep 0.5\nexec {shutil.which('tee')} \"$@\"\n")
    (shim / "tee").chmod(0o755)
    steps = [step for job in load(REUSABLE)["jobs"].values() for step in job.get("steps", [])
             if 'exec > >(tee "$STEP_LOGS/' in step.get("run", "")]
    assert len(steps) >= 6
    for step in steps:
        lines = step["run"].splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("exec > >(tee"))
        opening = [lines[start]]  # the tee, then what the step does about it before its own work
        for line in lines[start + 1:]:
            if line.startswith("#"):
                continue
            if not line.startswith(("tee_pid=", "trap ")):
                break
            opening.append(line)
        script = "\n".join(opening + ["echo 'the line that says why'", "exit 3"])
        logs = tmp_path / step["id"]
        logs.mkdir()
        # No pipe of ours for the tee to hold: this returns when the shell exits, as a runner's step ends.
        done = subprocess.run(["bash", "-e", "-c", script], env={"PATH": f"{shim}:/usr/bin:/bin", "STEP_LOGS": str(logs)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        assert done.returncode == 3, step["id"]
        log = logs / f"{step['id']}.log"
        assert log.exists() and "the line that says why" in log.read_text(), step["id"]
