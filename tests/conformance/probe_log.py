"""A setup module that records every symmetric-memory probe a rank makes: the rank and its pid, one line
each, appended to the file named by ``CONFORMANCE_TEST_PROBE_LOG``; the probe itself still runs."""

import os

import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

_empty = symm_mem.empty


def empty(*args, **kwargs):
    with open(os.environ["CONFORMANCE_TEST_PROBE_LOG"], "a") as log:
        log.write(f"{dist.get_rank()} {os.getpid()}\n")
    return _empty(*args, **kwargs)


symm_mem.empty = empty
