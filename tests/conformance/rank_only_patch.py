"""A setup module that changes torch only inside rank processes, so a test can tell where a probe ran:
there ``symm_mem.empty`` raises an error naming the device it was asked for."""

import importlib.util
import sys

import torch.distributed._symmetric_memory as symm_mem

# A rank's argv is the worker's, whether it started fresh or was forked (conformance.ranks.forkserver).
IN_RANK = sys.argv[0] == importlib.util.find_spec("conformance.ranks.worker").origin

if IN_RANK:
    def empty(*args, device=None, **kwargs):
        raise RuntimeError(f"probed on a rank, on device {device}")

    symm_mem.empty = empty
