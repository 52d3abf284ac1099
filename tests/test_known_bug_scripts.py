"""Every item of docs/known-bugs.md has its repro script in docs/known-bugs/, listed in the doc's table;
the scripts compile, an item without an upstream link carries a report text, and a one-process script
runs as documented (``python docs/known-bugs/<script>``)."""

from __future__ import annotations

import py_compile
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "known-bugs.md"
SCRIPTS = ROOT / "docs" / "known-bugs"


def _table() -> dict[int, tuple[str, str]]:
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \| (.+) \|$", DOC.read_text(), re.M)
    return {int(item): (script, upstream) for item, script, upstream in rows}


def test_every_item_has_a_listed_script():
    items = {int(n) for n in re.findall(r"^ {0,3}(\d+)\. \*\*", DOC.read_text(), re.M)}
    table = _table()
    assert items and sorted(table) == sorted(items), f"items {sorted(items)}, table rows {sorted(table)}"
    listed = {script for script, _ in table.values()}
    present = {p.name for p in SCRIPTS.glob("[0-9]*.py")}
    assert listed == present, f"listed but missing: {sorted(listed - present)}; present but unlisted: {sorted(present - listed)}"


def test_scripts_compile_and_unlinked_items_carry_a_report():
    for item, (script, upstream) in _table().items():
        path = SCRIPTS / script
        py_compile.compile(str(path), doraise=True)
        if "report text in the script" in upstream:
            text = path.read_text()
            assert "Report text (ready to file" in text and "Title: " in text, f"item {item}: {script} has no report text"


def test_a_one_process_script_runs_as_documented():
    done = subprocess.run([sys.executable, str(SCRIPTS / "17_unpickle_uint_float8.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch.int16: round-trips" in done.stdout
