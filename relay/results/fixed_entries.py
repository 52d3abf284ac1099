"""Known failures a run found fixed: its unexpected passes, grouped by the descriptor entry that said
they would fail.

The receiver keeps them in the run's summary (:func:`summarize`, from the report's ``known_failure`` of
each unexpected pass); the reporter reads them back (:func:`of_run`) to say on the PR which known
failures of which backend it fixes, and the proposals read those of pushes to upstream's main branch to
propose a torch bound for the entry (:mod:`relay.levels.proposals`). Reads and writes nothing itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from relay.store.per_test_results import test_id_of

__all__ = ["FixedEntry", "KEPT_TESTS", "UNEXPECTED_PASS", "of_run", "summarize"]

UNEXPECTED_PASS = "unexpected_pass"  # the report's outcome for a known failure that passed
KEPT_TESTS = 20  # test ids kept per entry in the summary (the count is kept whole)


@dataclasses.dataclass(frozen=True)
class FixedEntry:
    """One descriptor entry and the tests of a run that passed although it covers them."""

    match: str
    reason: str
    link: str
    torch: str | None  # the entry's bound when the run was made, if it had one
    tests: tuple[str, ...]  # the first KEPT_TESTS of them
    count: int


def summarize(report: Any) -> list[dict[str, Any]]:
    """The run summary's ``fixed`` list: one item per entry, in the order its first test appears."""
    grouped: dict[str, dict[str, Any]] = {}
    for test in report.tests:
        known = test.known_failure
        if test.outcome != UNEXPECTED_PASS or known is None:
            continue
        item = grouped.setdefault(known.match, {"match": known.match, "reason": known.reason, "link": known.link,
                                                "torch": known.torch, "tests": [], "count": 0})
        item["count"] += 1
        if len(item["tests"]) < KEPT_TESTS:
            item["tests"].append(test_id_of(test.suite, test.nodeid))
    return list(grouped.values())


def of_run(run: Any) -> tuple[FixedEntry, ...]:
    """The entries a stored run found fixed (none for a run without a report, or before schema 1.1)."""
    items = (getattr(run, "summary", None) or {}).get("fixed") or []
    out = []
    for item in items:
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("match", "reason", "link")):
            tests = tuple(t for t in item.get("tests") or () if isinstance(t, str))
            torch = item.get("torch") if isinstance(item.get("torch"), str) else None
            count = item.get("count") if isinstance(item.get("count"), int) else len(tests)
            out.append(FixedEntry(item["match"], item["reason"], item["link"], torch, tests, count))
    return tuple(out)
