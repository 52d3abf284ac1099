"""What the end-to-end loop (``bench/e2e_loop.py``) does without act: read the installed torch's commit, and end
what a cancelled step left running."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.e2e_loop import end_processes_working_in, torch_git_version


def test_torch_git_version_read_from_its_file_is_the_imported_torchs():
    import torch

    assert torch_git_version() == torch.version.git_version != ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_what_a_step_left_running_in_its_folder_ends_and_nothing_outside_it(tmp_path):
    inside, also, outside = tmp_path / "home" / "step", tmp_path / "repo", tmp_path / "elsewhere"
    for folder in (inside, also, outside):
        folder.mkdir(parents=True)
    # A session of their own, as act gives each step: no process group or parent links them to the caller.
    left = subprocess.Popen(["sleep", "60"], cwd=inside, start_new_session=True)
    also_left = subprocess.Popen(["sleep", "60"], cwd=also, start_new_session=True)
    kept = subprocess.Popen(["sleep", "60"], cwd=outside, start_new_session=True)
    try:
        assert sorted(end_processes_working_in(tmp_path / "home", also)) == sorted([left.pid, also_left.pid])
        assert left.wait(10) == -9 and also_left.wait(10) == -9
        assert kept.poll() is None
    finally:
        for process in (left, also_left, kept):
            process.kill()
            process.wait(10)
