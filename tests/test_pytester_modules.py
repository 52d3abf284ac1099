"""pytester restores ``sys.modules`` after each test that uses it, except what ``conftest.keeps_torch_imported``
keeps: torch's modules, which cannot be imported twice in one process. The first test leaves a module of each
kind in ``sys.modules`` (stand-ins, so that the check does not depend on what this process imported before);
the next one looks. pytest runs a file's tests in order, on one worker."""

from __future__ import annotations

import sys
import types

TORCH_LIKE = "torch._conformance_pytester_stand_in"
OTHER = "conformance_pytester_stand_in"


def test_modules_imported_under_pytester(pytester):
    for name in (TORCH_LIKE, OTHER):
        sys.modules[name] = types.ModuleType(name)
    pytester.makepyfile(test_inner=f"import sys, types\nsys.modules['{TORCH_LIKE}.inner'] = types.ModuleType('x')\n"
                                   "def test_nothing():\n    pass\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert f"{TORCH_LIKE}.inner" in sys.modules  # an in-process run's torch module stays too


def test_torch_modules_stay_imported_and_the_others_are_removed():
    try:
        assert TORCH_LIKE in sys.modules and f"{TORCH_LIKE}.inner" in sys.modules
        assert OTHER not in sys.modules
    finally:
        for name in (TORCH_LIKE, f"{TORCH_LIKE}.inner", OTHER):
            sys.modules.pop(name, None)
