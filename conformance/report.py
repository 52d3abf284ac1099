"""The JSON report: the versioned contract between a conformance run and the relay.

Written by the plugin at the end of a session (``--conformance-report PATH``); read by the CLI for its
summary table and by the relay when a downstream run calls back. The models below generate the JSON
Schema published at ``schemas/report.schema.json``; a test keeps the two identical. Torch-free.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "OUTCOMES",
    "SCHEMA_VERSION",
    "BackendInfo",
    "CapabilityStatus",
    "ConformanceReport",
    "HostInfo",
    "KnownFailureApplied",
    "RankOutcome",
    "ReportValidationError",
    "Summary",
    "TestResult",
    "TorchInfo",
    "load_report",
    "report_schema",
    "schema_path",
    "summarize",
    "validate_report",
    "write_report",
]

# 1.1 added the unexpected_pass outcome, tests[].known_failure and summary.unexpected_passes; 1.2 added
# tests[].world_size. Each is a superset of the one before, so readers accept all three.
SCHEMA_VERSION = "1.2"
# unexpected_pass: a test that a descriptor's known failure covers passed (news: bound or remove the entry);
# xpassed stays what pytest means by it, a test's own non-strict xfail marker that passed.
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error", "unexpected_pass")
Outcome = Literal["passed", "failed", "skipped", "xfailed", "xpassed", "error", "unexpected_pass"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapabilityStatus(_Model):
    declared: bool
    probed: bool
    reason: str = Field(default="", description="why the probe failed, verbatim")


class BackendInfo(_Model):
    name: str
    device_type: str
    distributed_backend: str
    world_size: int = Field(ge=1)
    capabilities: dict[str, CapabilityStatus]


class TorchInfo(_Model):
    version: str = Field(max_length=100, description="torch.__version__ (bounded like the relay's runs.torch_version)")
    git_version: str = Field(description="the git revision torch was built from")


class HostInfo(_Model):
    python: str
    platform: str
    cpu: str
    gpu: str | None = None
    driver: str | None = None


class Summary(_Model):
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    errors: int = 0
    unexpected_passes: int = Field(default=0, description="known failures that passed (not failures)")
    total: int = 0


class RankOutcome(_Model):
    """One rank's verdict on a test, in a run under a launcher (each launcher process runs the session)."""

    rank: int = Field(ge=0)
    node: str = Field(description="the launcher's node of this rank: 'node <GROUP_RANK> (<host>)'")
    outcome: Outcome
    message: str = ""


class KnownFailureApplied(_Model):
    """The descriptor's known-failure entry that applied to a test (as written in the descriptor)."""

    match: str
    reason: str
    link: str
    torch: str | None = Field(default=None, description="the entry's torch bound (PEP 440), if it has one")


class TestResult(_Model):
    nodeid: str
    suite: str
    outcome: Outcome
    duration: float = Field(ge=0, description="seconds, setup + call + teardown")
    message: str = Field(default="", description="first lines of the failure, skip or xfail reason")
    ranks: list[RankOutcome] = Field(
        default_factory=list, description="under a launcher: every rank's outcome and node (outcome is the worst)")
    known_failure: KnownFailureApplied | None = Field(
        default=None, description="the known-failure entry that applied (xfailed, skipped or unexpected_pass)")
    world_size: int | None = Field(
        default=None, ge=1, description="the ranks of the pool the test ran on (none: it did not run on ranks)")


class ConformanceReport(_Model):
    """A whole conformance run."""

    model_config = ConfigDict(extra="forbid", title="Conformance report")

    schema_version: Literal["1.0", "1.1", "1.2"] = SCHEMA_VERSION
    backend: BackendInfo
    torch: TorchInfo
    host: HostInfo
    started_at: datetime
    finished_at: datetime
    summary: Summary
    tests: list[TestResult]
    events: list[str] = Field(default_factory=list, description="pool respawns and other run events")

    def suites(self) -> dict[str, Summary]:
        """Per-suite counts, suites in first-seen order."""
        by_suite: dict[str, list[TestResult]] = {}
        for test in self.tests:
            by_suite.setdefault(test.suite, []).append(test)
        return {suite: summarize(tests) for suite, tests in by_suite.items()}


def summarize(tests: list[TestResult]) -> Summary:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for test in tests:
        counts[test.outcome] += 1
    return Summary(passed=counts["passed"], failed=counts["failed"], skipped=counts["skipped"],
                   xfailed=counts["xfailed"], xpassed=counts["xpassed"], errors=counts["error"],
                   unexpected_passes=counts["unexpected_pass"], total=len(tests))


def report_schema() -> dict:
    """The JSON Schema generated from the models (what ``schemas/report.schema.json`` must hold)."""
    schema = ConformanceReport.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://pytorch-conformance/report/{SCHEMA_VERSION}"
    return schema


def schema_path() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_packaged_schemas", here.parent / "schemas"):
        if (candidate / "report.schema.json").is_file():
            return candidate / "report.schema.json"
    raise FileNotFoundError(f"report.schema.json not found next to {here}; reinstall the package")


@lru_cache(maxsize=1)
def _published_schema() -> dict:
    return json.loads(schema_path().read_text())


class ReportValidationError(ValueError):
    """A report does not follow the published schema; the message names the first problem's path."""


def validate_report(data: dict) -> ConformanceReport:
    """validate_report(data) -> ConformanceReport, checked against the published JSON Schema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_published_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "<root>"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ReportValidationError(f"report invalid at {where}: {first.message}{more}")
    return ConformanceReport.model_validate(data)


def load_report(path: str | Path) -> ConformanceReport:
    return validate_report(json.loads(Path(path).read_text()))


def write_report(report: ConformanceReport, path: str | Path) -> None:
    """Write the report atomically: a temporary file in the same directory, then a rename over ``path``.

    A reader (the callback client, a CI step) sees the previous file or the whole new one, never a
    report cut short by a killed or cancelled run."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(report.model_dump_json(indent=2) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
