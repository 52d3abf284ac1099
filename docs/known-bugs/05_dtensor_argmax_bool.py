"""DTensor argmax/argmin accept bool input that eager refuses (known bug 5).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor argmax/argmin with a dim answer for bool tensors; eager raises

    Eager argmax/argmin raise "argmax(): does not support bool input". With a dim, DTensor's handler
    reduces with torch.max/torch.min (which accept bool) and returns indices instead of raising.

        b = torch.tensor([[True, False], [False, True]])
        distribute_tensor(b, mesh, [Replicate()]).argmax(dim=0)   # tensor([0, 1]); eager raises

    Reproduce: python 05_dtensor_argmax_bool.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/05_dtensor_argmax_bool.py``.
"""

import torch

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Replicate, distribute_tensor

    b = torch.tensor([[True, False], [False, True]])
    got = outcome(lambda: distribute_tensor(b, mesh(), [Replicate()]).argmax(dim=0))
    if rank == 0:
        print(f"torch {torch.__version__}: DTensor argmax(dim=0) {got}; eager {outcome(lambda: b.argmax(dim=0))}")


if __name__ == "__main__":
    spawn(body, 2)
