"""A setup module that changes torch only inside rank processes, so a test can tell where a probe ran:
there ``symm_mem.empty`` raises an error naming the device it was asked for, and, in a rank forked with
Dynamo imported (``capabilities.RANK_IMPORTS``), Dynamo says it is not supported."""

import importlib.util
import sys

import torch.distributed._symmetric_memory as symm_mem

# A rank's argv is the worker's, whether it started fresh or was forked (conformance.ranks.forkserver).
IN_RANK = sys.argv[0] == importlib.util.find_spec("conformance.ranks.worker").origin

if IN_RANK:
    def empty(*args, device=None, **kwargs):
        raise RuntimeError(f"probed on a rank, on device {device}")

    symm_mem.empty = empty
    if "torch._dynamo" in sys.modules:  # not imported here: a rank without it must stay without it
        sys.modules["torch._dynamo"].is_dynamo_supported = lambda: False
