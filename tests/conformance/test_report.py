"""The JSON report is a published contract: the committed schema matches the models and rejects bad reports."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conformance.report import ReportValidationError, report_schema, schema_path, validate_report

GOOD = {
    "schema_version": "1.0",
    "backend": {"name": "cpu", "device_type": "cpu", "distributed_backend": "gloo", "world_size": 2,
                "capabilities": {"collectives": {"declared": True, "probed": True, "reason": ""}}},
    "torch": {"version": "2.13.0+cpu", "git_version": "abc"},
    "host": {"python": "3.11.7", "platform": "Linux", "cpu": "x86", "gpu": None, "driver": None},
    "started_at": "2026-11-29T10:00:00Z",
    "finished_at": "2026-11-29T10:01:00Z",
    "summary": {"passed": 1, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0, "errors": 0, "total": 1},
    "tests": [{"nodeid": "test_collectives.py::test_barrier", "suite": "collectives", "outcome": "passed",
               "duration": 0.01, "message": ""}],
    "events": [],
}


def test_committed_schema_is_the_generated_one():
    committed = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "report.schema.json").read_text())
    assert committed == report_schema(), "regenerate schemas/report.schema.json (see docs/suite-authors.md, 'The JSON report')"
    assert schema_path().name == "report.schema.json"


def test_good_report_validates_and_counts_per_suite():
    report = validate_report(GOOD)
    assert report.suites()["collectives"].passed == 1


def test_a_1_1_report_carries_unexpected_passes_with_their_entry_and_1_0_stays_valid():
    data = copy.deepcopy(GOOD)
    data["schema_version"] = "1.1"
    entry = {"match": "collectives::test_barrier", "reason": "fixed upstream", "link": "https://example.org/1",
             "torch": "<2.15"}
    data["tests"][0].update(outcome="unexpected_pass", known_failure=entry)
    data["summary"].update(passed=0, unexpected_passes=1)
    report = validate_report(data)
    assert report.tests[0].known_failure.torch == "<2.15"
    assert report.suites()["collectives"].unexpected_passes == 1 and report.suites()["collectives"].failed == 0
    assert validate_report(GOOD).schema_version == "1.0"  # a reader of 1.1 accepts 1.0 reports
    del data["tests"][0]["known_failure"]["link"]
    with pytest.raises(ReportValidationError) as info:
        validate_report(data)
    assert str(info.value).startswith("report invalid at tests/0/known_failure: {'match': 'collectives::test_barrier'")
    assert str(info.value).endswith("is not valid under any of the given schemas")


def test_a_1_2_report_names_the_pool_size_of_each_test_and_refuses_a_pool_of_none():
    data = copy.deepcopy(GOOD)
    data["schema_version"] = "1.2"
    data["tests"][0]["world_size"] = 4
    assert validate_report(data).tests[0].world_size == 4
    assert validate_report(GOOD).tests[0].world_size is None  # 1.0 and 1.1 reports stay valid
    data["tests"][0]["world_size"] = 0
    with pytest.raises(ReportValidationError, match="report invalid at tests/0/world_size: 0 is not valid under any"):
        validate_report(data)


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r.pop("backend"), "report invalid at <root>: 'backend' is a required property"),
    (lambda r: r["tests"][0].update(outcome="exploded"), "report invalid at tests/0/outcome: 'exploded' is not one of"),
    (lambda r: r.update(schema_version="2.0"), "report invalid at schema_version: '2.0' is not one of ['1.0', '1.1', '1.2']"),
    (lambda r: r["summary"].update(passed="many"), "report invalid at summary/passed: 'many' is not of type 'integer'"),
    (lambda r: r["tests"][0].update(duration=-1), "report invalid at tests/0/duration: -1 is less than the minimum of 0"),
    (lambda r: r.update(extra=1), "Additional properties are not allowed ('extra' was unexpected)"),
])
def test_bad_reports_are_refused_naming_the_problem(mutate, expected):
    data = copy.deepcopy(GOOD)
    mutate(data)
    with pytest.raises(ReportValidationError) as info:
        validate_report(data)
    assert expected in str(info.value)


def test_write_report_is_atomic(tmp_path, monkeypatch):
    from conformance.report import ConformanceReport, load_report, write_report

    good = ConformanceReport.model_validate(json.loads(json.dumps(_REPORT_FOR_WRITE)))
    path = tmp_path / "out" / "report.json"
    write_report(good, path)
    assert load_report(path).summary.total == 0

    # A write that dies half-way leaves the previous report whole and no temporary file behind.
    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(good.model_copy(update={"events": ["second"]}), path)
    assert load_report(path).events == []
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]


_REPORT_FOR_WRITE = {
    "backend": {"name": "cpu", "device_type": "cpu", "distributed_backend": "gloo", "world_size": 2, "capabilities": {}},
    "torch": {"version": "2.13.0", "git_version": "abc"},
    "host": {"python": "3.11", "platform": "linux", "cpu": "x86_64"},
    "started_at": "2024-05-01T10:00:00Z", "finished_at": "2024-05-01T10:05:00Z",
    "summary": {"total": 0}, "tests": [],
}
