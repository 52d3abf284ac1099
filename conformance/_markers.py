"""Marker shortcuts: ``@requires("dtensor")``, ``@world_size(4)`` and ``@min_ranks(2)``."""

import pytest

requires = pytest.mark.requires
world_size = pytest.mark.world_size
min_ranks = pytest.mark.min_ranks
