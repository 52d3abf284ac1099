"""A valid conformance report (the JSON a backend's run sends with its ``completed`` callback), for tests.

Used by the relay's tests and benchmarks, and by backend owners' tests of their own callers: the report
follows ``schemas/report.schema.json`` (:func:`conformance.report.validate_report` accepts it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["conformance_report"]


def conformance_report(backend: str, tests: list[tuple[str, str, str]] | None = None, git_version: str = "a" * 40) -> dict[str, Any]:
    """A valid conformance report; ``tests`` are (nodeid, outcome, message), suite from the file name;
    ``git_version`` is the tested torch's commit (default: the Driver's default PR head)."""
    tests = tests if tests is not None else [
        ("conformance/suites/test_collectives.py::test_all_reduce[sum]", "passed", ""),
        ("conformance/suites/test_collectives.py::test_broadcast", "failed", "AssertionError: rank 1 got 0"),
    ]
    rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0, "errors": 0}
    for nodeid, outcome, message in tests:
        suite = nodeid.split("::")[0].rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
        rows.append({"nodeid": nodeid, "suite": suite, "outcome": outcome, "duration": 0.25, "message": message})
        counts["errors" if outcome == "error" else outcome] += 1
    return {
        "schema_version": "1.0",
        "backend": {"name": backend, "device_type": "cpu", "distributed_backend": "gloo", "world_size": 2,
                    "capabilities": {"collectives": {"declared": True, "probed": True, "reason": ""}}},
        "torch": {"version": "2.13.0", "git_version": git_version},
        "host": {"python": "3.11", "platform": "linux", "cpu": "x86_64"},
        "started_at": "2024-05-01T10:00:00Z", "finished_at": "2024-05-01T10:05:00Z",
        "summary": {**counts, "total": len(rows)}, "tests": rows, "events": [],
    }
