"""Marker shortcuts: ``@requires("dtensor")`` and ``@world_size(4)``."""

import pytest

requires = pytest.mark.requires
world_size = pytest.mark.world_size
