"""Marker shortcuts: ``@requires("dtensor")``, ``@world_size(4)``, ``@min_ranks(2)`` and ``@shared_dir``."""

import pytest

requires = pytest.mark.requires
world_size = pytest.mark.world_size
min_ranks = pytest.mark.min_ranks
shared_dir = pytest.mark.shared_dir
