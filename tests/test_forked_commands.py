"""The tests' commands forked from the torch-imported server (tests/forked_commands.py) see what a fresh
interpreter would, and run fresh where a fork could not be faithful."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forked_commands

ROOT = Path(__file__).resolve().parents[1]
PROBE = [sys.executable, "-m", "tests.command_probe"]


def probe(*args: str, env: dict[str, str] | None = None, fresh: bool = False):
    env = {**os.environ, "CONFORMANCE_TEST_MARKER": "m", "PYTHONPATH": "/nonexistent/first", **(env or {})}
    done = forked_commands.run([*PROBE, *args], env=env, cwd=ROOT, timeout=120, fresh=fresh)
    return done, json.loads(done.stdout.splitlines()[0])


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_a_forked_command_sees_what_a_fresh_one_does(sigint):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    try:
        forked, seen = probe("0")
        fresh, seen_fresh = probe("0", fresh=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen["sigint"] is (sigint == "handled")  # an ignored SIGINT stays ignored across exec
    assert seen["preloaded"] and not seen_fresh["preloaded"]  # the first was forked, the second was not
    assert seen["parent"] != os.getpid() and seen_fresh["parent"] == os.getpid()
    for key in ("argv", "cwd", "path", "marker", "project_modules", "main", "stdin", "sigint", "sigterm"):
        assert seen[key] == seen_fresh[key], key
    assert seen["path"][:2] == [str(ROOT), "/nonexistent/first"]
    assert seen["argv"][1:] == ["0"] and seen["project_modules"] == []
    assert forked.stderr == fresh.stderr == "to stderr\n"
    assert forked.stdout.splitlines()[1:] == fresh.stdout.splitlines()[1:] == ["exit handlers ran"]


@pytest.mark.parametrize("args, code, stderr", [(["3"], 3, "to stderr\n"), (["raise"], 1, "RuntimeError: raised at the top level")])
def test_a_forked_command_exits_as_a_fresh_one_would(args, code, stderr):
    for fresh in (False, True):
        done, seen = probe(*args, fresh=fresh)
        assert seen["preloaded"] is not fresh
        assert done.returncode == code and stderr in done.stderr, (fresh, done)


def test_a_forked_command_waits_for_its_threads_before_its_exit_handlers_as_a_fresh_one_does():
    for fresh in (False, True):
        done, seen = probe("thread", fresh=fresh)
        assert seen["preloaded"] is not fresh
        assert done.stdout.splitlines()[1:] == ["thread ended", "exit handlers ran"], (fresh, done.stdout)


def test_a_forked_command_can_be_signalled_and_is_not_signalled_once_reaped(tmp_path):
    out = open(tmp_path / "out", "wb")
    process = forked_commands.popen([*PROBE, "hang"], env=dict(os.environ), cwd=ROOT, stdout=out.fileno(),
                                    stderr=out.fileno())
    out.close()
    assert isinstance(process, forked_commands.ForkedCommand)
    deadline = time.monotonic() + 60
    while b"preloaded" not in (tmp_path / "out").read_bytes():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.1)
    process.kill()
    assert process.wait(30) == -signal.SIGKILL
    process.kill()  # reaped: no signal goes to whatever has that pid now
    assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("env", [{"TORCH_SHOW_CPP_STACKTRACES": "1"}, {"OMP_NUM_THREADS": "7"},
                                 {"PYTHONUNBUFFERED": "x"}, {"CONFORMANCE_TEST_TAG": "t"}],
                         ids=["torch-setting", "openmp-setting", "python-setting", "found-by-environ"])
def test_a_command_whose_environment_a_fork_could_not_have_runs_fresh(env):
    done, seen = probe(env=env)
    assert not seen["preloaded"] and seen["parent"] == os.getpid()
    assert done.returncode == 0


def test_anything_but_a_module_or_console_script_of_this_python_runs_fresh(tmp_path):
    done = forked_commands.run([sys.executable, "-c", "import sys, os; print('torch' in sys.modules, os.getppid())"],
                               cwd=tmp_path, timeout=60)
    assert done.stdout.split() == ["False", str(os.getpid())]
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho $PPID\n")
    script.chmod(0o755)
    assert forked_commands.run([str(script)], cwd=tmp_path, timeout=60).stdout.strip() == str(os.getpid())


def test_a_console_script_of_this_python_is_forked_and_another_environments_python_is_not(tmp_path):
    script = tmp_path / "probe-script"
    script.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_module('tests.command_probe', run_name='__main__')\n")
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    forked = forked_commands.run([str(script), "5"], env=env, cwd=tmp_path, timeout=60)
    seen = json.loads(forked.stdout.splitlines()[0])
    assert forked.returncode == 5 and seen["preloaded"] and seen["argv"] == [str(script), "5"]
    assert seen["path"][:2] == [str(tmp_path), str(ROOT)]  # the script's folder first, as Python puts it
    other = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    done = forked_commands.run([str(other / "bin" / "python"), "-m", "tests.command_probe"], env=env, cwd=ROOT,
                               timeout=60)
    assert done.returncode == 0 and not json.loads(done.stdout.splitlines()[0])["preloaded"]
