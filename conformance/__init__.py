"""Cross-backend conformance suite for distributed PyTorch.

What a suite author needs, re-exported here (imported lazily, so ``import conformance`` stays
torch-free and the relay can read descriptors and the report schema without torch):

* markers: ``requires(*capabilities)``, ``world_size(n)``, ``min_ranks(n)``, ``shared_dir``
* running on ranks: ``RankContext`` (what a rank function receives), ``RankPool``, and the errors
  ``RankError``, ``RankTimeout``, ``RankCrashed``
* checking results: ``assert_close``, ``assert_ranks_equal``, ``ConformanceFailure``
* descriptors and reports: ``BackendDescriptor``, ``load_descriptors``, ``ConformanceReport``,
  ``validate_report``

Module map: ``descriptors`` (backends/*.yaml), ``detect`` (which one is here), ``capabilities``
(probes), ``ranks/`` (the pool), ``session`` (one run), ``plugin`` (pytest glue), ``items`` (what a
collected test needs), ``report`` (JSON contract), ``checks`` (assertions), ``cli`` (``conformance``
command), ``suites/`` (the tests).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "requires": ("conformance._markers", "requires"),
    "world_size": ("conformance._markers", "world_size"),
    "min_ranks": ("conformance._markers", "min_ranks"),
    "shared_dir": ("conformance._markers", "shared_dir"),
    "RankContext": ("conformance.ranks", "RankContext"),
    "RankPool": ("conformance.ranks", "RankPool"),
    "RankError": ("conformance.ranks", "RankError"),
    "RankTimeout": ("conformance.ranks", "RankTimeout"),
    "RankCrashed": ("conformance.ranks", "RankCrashed"),
    "assert_close": ("conformance.checks", "assert_close"),
    "assert_ranks_equal": ("conformance.checks", "assert_ranks_equal"),
    "ConformanceFailure": ("conformance.checks", "ConformanceFailure"),
    "BackendDescriptor": ("conformance.descriptors", "BackendDescriptor"),
    "DescriptorError": ("conformance.descriptors", "DescriptorError"),
    "load_descriptors": ("conformance.descriptors", "load_descriptors"),
    "ConformanceReport": ("conformance.report", "ConformanceReport"),
    "validate_report": ("conformance.report", "validate_report"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'conformance' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
