"""The built wheel carries what an installed `conformance` needs: descriptors, the report schema, the suites."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel unpacked into its own directory, first on the import path (deps from this env)."""
    wheels = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheel here: {built.stderr.strip().splitlines()[-1:]}")
    target = tmp_path_factory.mktemp("site")
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    # This environment already registers the pytest11 entry point; a second copy would register twice.
    for info in target.glob("*.dist-info"):
        shutil.rmtree(info)
    return target


def run(installed, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_wheel_ships_descriptors_schema_and_suites(installed):
    package = installed / "conformance"
    assert {p.name for p in (package / "_packaged_backends").iterdir()} >= {
        "cpu.yaml", "cuda.yaml", "rocm.yaml", "xpu.yaml", "privateuse1.yaml.template"}
    schema = json.loads((package / "_packaged_schemas" / "report.schema.json").read_text())
    assert schema["title"] == "Conformance report"
    assert (package / "suites" / "pytest.ini").is_file()
    assert (package / "suites" / "test_collectives.py").is_file()


def test_installed_package_runs_from_any_directory(installed, tmp_path):
    backends = run(installed, "backends", cwd=tmp_path)
    assert backends.returncode == 0, backends.stderr
    assert str(installed / "conformance" / "_packaged_backends" / "cpu.yaml") in backends.stdout
    result = run(installed, "run", "--suite", "collectives", "--report", "r.json", "--", "-k", "test_barrier",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert [t["outcome"] for t in report["tests"]] == ["passed"]
    assert report["tests"][0]["nodeid"] == "test_collectives.py::test_barrier"
    assert f"rootdir: {installed / 'conformance' / 'suites'}" in result.stdout  # the installed copy ran
