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
    # .ci/run runs it as one command line of its own (its status kept for the end: `|| tests_status=$?`).
    runs = [line for line in ci.splitlines() if line.split(" || ")[0] == test_command]
    assert len(runs) == 1, f".ci/run should run the README's test command `{test_command}` once; it runs it {len(runs)} times"


# A path the README or a guide names: from one of the project's top folders, up to the first character
# no path of this tree holds. One followed by a placeholder or a pattern (``<backend>``, ``{o}``, ``*``)
# names a family, not a file, and is left out; so is one inside a URL.
_TOP_FOLDERS = ("relay", "conformance", "tests", "bench", "docs", "backends", "schemas", "workflows", ".github", ".ci")
_PATH = re.compile(r"(?<![\w./:-])(?:%s)/[\w./-]*" % "|".join(re.escape(top) for top in _TOP_FOLDERS))


def _named_paths(document: Path) -> set[str]:
    text = document.read_text()
    named = set()
    for match in _PATH.finditer(text):
        if text[match.end():match.end() + 1] in ("<", "{", "*", "["):
            continue
        named.add(match.group(0).rstrip(".,:;)"))
    return named


# Named in the docs, and rightly not in this tree.
_ELSEWHERE = {
    "tests/1/outcome": "a place inside a report, in an error's detail (callback-contract.md)",
    ".github/workflows/crcr.yml": "where a backend repository puts its caller (onboarding.md)",
    "backends/npu.yaml": "an out-of-tree backend's own descriptor, in its repository (onboarding.md)",
    "conformance/suites/test_example.py": "the file the suite authors' example makes (suite-authors.md)",
}


def test_every_path_the_docs_name_exists():
    documents = [README, *sorted((ROOT / "docs").glob("*.md"))]
    missing = [f"{document.relative_to(ROOT)}: {path}" for document in documents
               for path in sorted(_named_paths(document) - set(_ELSEWHERE)) if not (ROOT / path).exists()]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


# A path named from inside a package (``store/facade.py``, ``results/receiver.py``), as the guides to the
# code do: it must exist under the root or under one of the packages.
_RELATIVE_PATH = re.compile(r"(?<![\w./:-])\w[\w-]*(?:/[\w.-]+)+\.(?:py|yaml|yml|json|sh|md)\b")
_SEARCHED = (ROOT, ROOT / "relay", ROOT / "conformance", ROOT / "tests")
_OUTSIDE_THIS_TREE = {
    "torch/distributed/tensor/_nonlinear_redux.py": "torch's own source (known-bugs.md)",
    "torch/export/pt2_archive/_package.py": "torch's own source, where an AOTInductor call hung (benchmarks.md)",
    "torch/version.py": "torch's own file, where the end-to-end tests read its commit (benchmarks.md)",
    "backends/privateuse1.yaml": "an out-of-tree backend's descriptor, in its repository (onboarding.md, suite-authors.md)",
    "owner/repo/.github/workflows/file.yml": "the form of an OIDC token's workflow reference (relay-security.md)",
    "ci/cuda.yaml": "a backend repository's own file (trust-levels.md)",
}


def test_every_path_named_inside_a_package_exists():
    documents = [README, *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for document in documents:
        for match in _RELATIVE_PATH.finditer(document.read_text()):
            path = match.group(0)
            if path in _OUTSIDE_THIS_TREE or path in _ELSEWHERE:
                continue
            if not any((base / path).exists() for base in _SEARCHED):
                missing.append(f"{document.relative_to(ROOT)}: {path}")
    assert not missing, "paths named in the docs that exist under no package:\n" + "\n".join(missing)
