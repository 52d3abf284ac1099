"""The README's and the guides' examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SUITE_AUTHORS = ROOT / "docs" / "suite-authors.md"


def _block_after(heading: str, document: Path) -> str:
    text = document.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_writing_a_suite_example_runs(pytester):
    pytester.makepyfile(test_example=_block_after("## Writing a suite", SUITE_AUTHORS))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert "needs 4 ranks" in result.stdout.str()


def test_quick_start_commands_are_the_documented_ones():
    text = README.read_text()
    quick = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == [
        "python3 -m venv .venv && . .venv/bin/activate",
        'pip install "torch==2.13.0" ".[suite]" && conformance run',
        "bash .ci/run",
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = re.search(r"then runs the test command, `([^`]+)`", text.replace("\n", " ")).group(1)
    assert ci.rstrip().splitlines()[-1] == test_command
