"""Rank functions must put every tensor they make on ``ctx.device``. On a CPU rank a forgetful body is
right by accident, so the project's own runs give ranks ``meta`` as their default device (the root
``conftest.py``): the forgetful body then fails at its first collective, as it would over NCCL."""

from __future__ import annotations

import os

import pytest
import torch

from conformance.ranks import DEFAULT_DEVICE_ENV, RankError, RankPool
from tests.conformance import rank_functions as fns


def _pool(default_device):
    env = {k: v for k, v in os.environ.items() if k != DEFAULT_DEVICE_ENV}
    return RankPool(descriptor="cpu", device_type="cpu", backend="gloo", world_size=2, timeout=60,
                    grace=1.0, env=env, default_device=default_device)


def test_the_projects_runs_give_ranks_the_meta_default_device():
    assert os.environ.get(DEFAULT_DEVICE_ENV) == "meta"


def test_a_forgetful_body_passes_on_plain_cpu_ranks_and_is_caught_under_meta():
    with _pool(None) as plain:
        # What the mechanism exists for: without it, CPU cannot tell the bodies apart.
        assert [t.tolist() for t in plain.run(fns.forgetful_all_reduce)] == [[1.0] * 4] * 2
    with _pool("meta") as pool:
        with pytest.raises(RankError) as caught:
            pool.run(fns.forgetful_all_reduce)
        assert caught.value.failed_ranks == [0, 1]
        assert all("meta" in e.message for e in caught.value.errors), caught.value
        with pytest.raises(RankError, match="Cannot copy out of meta tensor"):
            pool.run(fns.forgetful_result)
        # The faithful body is unaffected, and its results still come back on CPU.
        results = pool.run(fns.faithful_all_reduce)
        assert [(t.device.type, t.tolist(), default) for t, default in results] == [("cpu", [1.0] * 4, "meta")] * 2
        assert torch.equal(results[0][0], torch.ones(4))
