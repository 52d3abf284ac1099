"""The project's own test runs (not a user's `conformance run`): rank functions see `meta` as their default
device, so a suite body that creates a tensor without `ctx.device` fails here as it would on a GPU.
Set before any pool starts; rank processes, xdist workers and `conformance run` subprocesses inherit it."""

import os

os.environ.setdefault("CONFORMANCE_RANK_DEFAULT_DEVICE", "meta")
