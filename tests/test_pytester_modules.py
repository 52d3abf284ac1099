"""pytester restores ``sys.modules`` after each test that uses it and after each in-process run, except what
``conftest.keeps_torch_imported`` keeps: torch's modules, which cannot be imported twice in one process.
Stand-in modules, so that the check does not depend on what this process imported before."""

from __future__ import annotations

import sys
import types

TORCH_LIKE = "torch._conformance_pytester_stand_in"
OTHER = "conformance_pytester_stand_in"


def test_torch_modules_stay_imported_and_the_others_are_removed(pytester):
    names = (TORCH_LIKE, f"{TORCH_LIKE}.inner", OTHER)
    try:
        pytester.makepyfile(test_inner=f"import sys, types\nsys.modules['{TORCH_LIKE}.inner'] = types.ModuleType('x')\n"
                                       "def test_nothing():\n    pass\n")
        pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
        assert f"{TORCH_LIKE}.inner" in sys.modules  # an in-process run's torch module stays
        for name in (TORCH_LIKE, OTHER):
            sys.modules[name] = types.ModuleType(name)
        pytester._sys_modules_snapshot.restore()  # what pytester does after the test
        assert TORCH_LIKE in sys.modules and f"{TORCH_LIKE}.inner" in sys.modules
        assert OTHER not in sys.modules
    finally:
        for name in names:
            sys.modules.pop(name, None)
