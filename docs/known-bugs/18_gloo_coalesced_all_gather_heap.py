"""gloo corrupts its process's heap when two allgather_into_tensor_coalesced calls are in flight together
(known bug 18).

Report text (ready to file at pytorch/pytorch):

    Title: ProcessGroupGloo: two allgather_into_tensor_coalesced in flight corrupt the heap (SIGSEGV / SIGABRT)

    Issuing two ProcessGroup.allgather_into_tensor_coalesced calls before waiting either (which is what
    two functional all_gather_single calls do, both going through _c10d_functional.all_gather_into_tensor,
    e.g. DTensor's argmax/argmin handler, _nonlinear_redux.py _gather_tensors) makes a gloo rank die some
    time later with SIGSEGV, or SIGABRT after glibc's "malloc(): unaligned tcache chunk detected" /
    "free(): invalid pointer". On 2 ranks, 3000 rounds crashed 4 launches of 4; the same calls waited one
    at a time crashed none, nor did _allgather_base or all_gather_into_tensor(async_op=True) in flight
    together. Expected: concurrent coalesced all_gathers are safe, as every other async collective.

    Reproduce: python 18_gloo_coalesced_all_gather_heap.py [ROUNDS] (2 gloo ranks on one machine; a rank
    dies with SIGSEGV or SIGABRT, or the script prints that all rounds passed). The crash is rare: some
    launches of 3000-6000 rounds pass; run it several times.

Run: ``python docs/known-bugs/18_gloo_coalesced_all_gather_heap.py [ROUNDS]``.
"""

import faulthandler
import sys

import torch
import torch.distributed as dist

from _ranks import spawn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000


def body(rank, world):
    faulthandler.enable()
    group = dist.group.WORLD
    x, y = torch.randn(5, 1), torch.arange(5).reshape(5, 1)
    for _ in range(ROUNDS):
        a = group.allgather_into_tensor_coalesced([torch.empty(5 * world, 1)], [x])
        b = group.allgather_into_tensor_coalesced([torch.empty(5 * world, 1, dtype=torch.int64)], [y])
        a.wait()
        b.wait()
    if rank == 0:
        print(f"torch {torch.__version__}: {ROUNDS} rounds of two coalesced all_gathers in flight, no rank lost")


if __name__ == "__main__":
    spawn(body, 2)
