"""What a collected test asks of a run, read from the test item: its suite, its id in known-failure
patterns, the capabilities it requires and the ranks it needs.

Apart from the plugin so that ``conformance.cli`` can read items without importing the plugin before
pytest does: pytest rewrites the assertions of a plugin it is told to load (``-p conformance.plugin``)
and warns on every run when that module is already imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.descriptors import CAPABILITIES

__all__ = ["SUITES_DIR", "required_capabilities", "required_min_ranks", "required_world_size", "suite_name",
           "test_id_of"]

SUITES_DIR = Path(__file__).resolve().parent / "suites"


def suite_name(path: str | os.PathLike) -> str:
    """``.../test_collectives.py`` -> ``collectives``."""
    return Path(path).stem.removeprefix("test_")


def test_id_of(item: pytest.Item) -> str:
    """What known-failure patterns match: ``<suite>::<test name with parameters>``."""
    return f"{suite_name(item.path)}::{item.name}"


def required_capabilities(item: pytest.Item) -> list[str]:
    needed: list[str] = []
    for marker in item.iter_markers("requires"):
        for name in marker.args:
            if name not in CAPABILITIES:
                raise pytest.UsageError(
                    f"{item.nodeid}: @requires({name!r}): unknown capability; allowed: {', '.join(CAPABILITIES)}")
            needed.append(name)
    return needed


def required_world_size(item: pytest.Item) -> int | None:
    """The ranks of the pool the test needs exactly (``@world_size(n)``), or None."""
    return _positive_int_marker(item, "world_size")


def required_min_ranks(item: pytest.Item) -> int | None:
    """The fewest ranks the test runs with (``@min_ranks(n)``), or None."""
    return _positive_int_marker(item, "min_ranks")


def _positive_int_marker(item: pytest.Item, name: str) -> int | None:
    marker = item.get_closest_marker(name)
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], int) or marker.args[0] < 1:
        raise pytest.UsageError(f"{item.nodeid}: @{name} takes one positive int, got {marker.args!r}")
    return marker.args[0]
