"""gloo has no int16, uint16, uint32, uint64 or float8 reductions, and its gather no complex (known bug 12).

Report text (ready to file at pytorch/pytorch):

    Title: ProcessGroupGloo: collectives raise "Invalid scalar type" for int16, uint16/32/64 and float8

    gloo's type switch (GENERATE_ALL_TYPES in ProcessGroupGloo.cpp) has no case for torch.int16,
    torch.uint16, torch.uint32, torch.uint64 or the float8 dtypes, so every collective on them raises
    "Invalid scalar type" (send/recv move them, as raw bytes). gather also refuses complex tensors,
    although broadcast, all_gather, scatter and all_to_all move them. Expected: movement collectives
    move every dtype (they are bytes), and reductions either support them or raise a message that names
    the dtype.

    Reproduce: python 12_gloo_missing_dtypes.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/12_gloo_missing_dtypes.py``.
"""

import torch
import torch.distributed as dist

from _ranks import attempt, spawn


def body(rank, world):
    for dtype in (torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn):
        for what, call in (("all_reduce", lambda t: dist.all_reduce(t)), ("broadcast", lambda t: dist.broadcast(t, 0))):
            got = attempt(lambda: call(torch.zeros(4, dtype=dtype)))
            if rank == 0:
                print(f"torch {torch.__version__}: {what} on {dtype}: {got}")
    gather_list = [torch.empty(2, dtype=torch.complex64) for _ in range(world)] if rank == 0 else None
    got = attempt(lambda: dist.gather(torch.zeros(2, dtype=torch.complex64), gather_list, dst=0))
    if rank == 0:
        print(f"torch {torch.__version__}: gather on torch.complex64: {got}")


if __name__ == "__main__":
    spawn(body, 2)
