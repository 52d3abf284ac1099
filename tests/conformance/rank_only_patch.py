"""A setup module that changes torch only inside rank processes, so a test can tell where a probe ran:
there ``symm_mem.empty`` raises an error naming the device it was asked for."""

import sys

import torch.distributed._symmetric_memory as symm_mem

IN_RANK = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") == "conformance.ranks.worker"

if IN_RANK:
    def empty(*args, device=None, **kwargs):
        raise RuntimeError(f"probed on a rank, on device {device}")

    symm_mem.empty = empty
