"""The conformance suites under several torch releases: one table of what each reports.

For each torch version given, a fresh virtual environment gets that torch and this checkout's ``runner``
extra (``pip install torch==V -e .[runner]``), then runs ``conformance run`` with no ``--backend``, so
detection picks what the machine has (CPU over gloo for the default CUDA wheel on a machine with no GPU)
and the descriptors' torch bounds are evaluated against that torch. Prints one table: torch, passed,
failed (and errors), unexpected passes, known failures applied (tests a descriptor entry covered:
xfailed, skipped or unexpectedly passed), wall time; then each unexpected pass's entry, to bound or remove,
and the JSON line of every benchmark here, whose ``ratio`` is each version's time over the first one's.

    python bench/torch_versions.py [VERSION ...] [--python VERSION=PATH ...] [--keep DIR] [-- conformance run args]

Defaults: 2.13.0 2.14.1 2.15.0. ``--python 2.15.0=/path/bin/python`` uses an environment that already has
that torch instead of making one (the checkout comes first on its path, so its code is what runs). Where
pip's global constraints cap torch, ``PIP_CONSTRAINT=<an empty file>`` lifts the cap for this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VERSIONS = ("2.13.0", "2.14.1", "2.15.0")
COLUMNS = ("torch", "exit", "passed", "failed", "unexpected passes", "known failures applied", "time (s)")


def make_environment(version: str, folder: Path) -> Path:
    """A fresh virtual environment with torch ``version`` and the runner extra; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={version}", "-e", f"{ROOT}[runner]"],
                   check=True)
    return python


def run_suites(python: Path, report: Path, extra: list[str]) -> tuple[int, float, str]:
    """(exit status, seconds, last lines of output) of ``conformance run`` under ``python``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = subprocess.run([str(python), "-m", "conformance", "run", "--report", str(report), *extra],
                          cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    return done.returncode, time.perf_counter() - start, (done.stdout + done.stderr)[-3000:]


def row_of(code: int, seconds: float, report_path: Path) -> tuple[list[str], list[str]]:
    """The table row and the unexpected-pass lines of one run."""
    report = json.loads(report_path.read_text())
    summary = report["summary"]
    applied = sum(1 for t in report["tests"] if t.get("known_failure"))
    row = [report["torch"]["version"], str(code), str(summary["passed"]), str(summary["failed"] + summary["errors"]),
           str(summary.get("unexpected_passes", 0)), str(applied), f"{seconds:.0f}"]
    fixed: dict[str, int] = {}
    for test in report["tests"]:
        if test["outcome"] == "unexpected_pass":
            fixed[test["known_failure"]["match"]] = fixed.get(test["known_failure"]["match"], 0) + 1
    notes = [f"{report['torch']['version']} ({report['backend']['name']}): {match!r} passed ({count} tests)"
             for match, count in fixed.items()]
    return row, notes


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS))
    parser.add_argument("--python", action="append", default=[], metavar="VERSION=PATH",
                        help="use this interpreter (which has that torch) instead of a fresh environment")
    parser.add_argument("--keep", default=None, metavar="DIR", help="make the environments here and keep them")
    args = parser.parse_args(argv)
    given = dict(item.split("=", 1) for item in args.python)
    rows, notes, failures = [], [], []
    with tempfile.TemporaryDirectory(prefix="torch-versions-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        for version in args.versions:
            python = Path(given[version]) if version in given else make_environment(version, base / f"torch-{version}")
            report = Path(tmp) / f"report-{version}.json"
            code, seconds, tail = run_suites(python, report, extra)
            if not report.exists():
                failures.append(f"torch {version}: no report (exit {code}):\n{tail}")
                rows.append([version, str(code), "-", "-", "-", "-", f"{seconds:.0f}"])
                continue
            row, fixed = row_of(code, seconds, report)
            rows.append(row)
            notes += fixed
    print(markdown(rows))
    if notes:
        print("\nunexpected passes (entries to bound or remove):")
        print("\n".join(f"- {line}" for line in notes))
    for failure in failures:
        print(failure, file=sys.stderr)
    figures = {row[0]: dict(zip(COLUMNS[1:], row[1:])) for row in rows}
    seconds = [float(row[-1]) for row in rows]
    print(json.dumps({"name": "torch_versions", "figures": figures,
                      "ratio": {row[0]: round(t / seconds[0], 2) if seconds[0] else None
                                for row, t in zip(rows, seconds)}}))
    return 1 if failures or any(row[1] != "0" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
