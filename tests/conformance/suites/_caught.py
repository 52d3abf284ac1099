"""The shape of every catches test: a check passes with the real implementation and fails with a broken
one, saying ``match``."""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure


def caught(check, *args, match: str, **broken) -> None:
    """``check(*args)`` passes; ``check(*args, **broken)`` (e.g. ``impl=...``) raises ConformanceFailure
    matching ``match``."""
    check(*args)
    with pytest.raises(ConformanceFailure, match=match):
        check(*args, **broken)
