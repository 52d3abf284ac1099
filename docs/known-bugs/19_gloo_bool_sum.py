"""gloo's SUM on bool tensors stores the integer sum in each byte (known bug 19).

Report text (ready to file at pytorch/pytorch):

    Title: ProcessGroupGloo all_reduce(SUM) on bool tensors writes 0x02 into a bool (True + True)

    On gloo, all_reduce / reduce with ReduceOp.SUM on a torch.bool tensor adds the bytes: where two
    ranks hold True the result byte is 0x02, a value no bool may hold (True is 0x01). It prints as True,
    but its bytes differ from True's (t.view(torch.uint8) shows 2), and code that relies on the
    representation (view as uint8, hashing the bytes, comparisons of raw memory, the next reduction)
    sees a value that is not a bool. Expected: logical or (True, 0x01), as torch.stack(...).any(0).

    Reproduce: python 19_gloo_bool_sum.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/19_gloo_bool_sum.py``.
"""

import torch
import torch.distributed as dist

from _ranks import spawn


def body(rank, world):
    t = torch.tensor([True, True, False])
    dist.all_reduce(t)
    if rank == 0:
        print(f"torch {torch.__version__}: all_reduce(SUM) of [True, True, False] on 2 ranks: {t.tolist()}, "
              f"bytes {t.view(torch.uint8).tolist()} (True is 1)")


if __name__ == "__main__":
    spawn(body, 2)
