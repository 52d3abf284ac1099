"""gloo treats strided views as contiguous in all_reduce/broadcast/reduce (known bug 9; upstream:
https://github.com/pytorch/pytorch/issues/192920).

Run: ``python docs/known-bugs/09_gloo_strided_views.py``.
"""

import torch
import torch.distributed as dist

from _ranks import spawn


def body(rank, world):
    m = torch.arange(12.).view(4, 3) * (rank + 1)
    dist.all_reduce(m[:, 1])
    if rank == 0:
        print(f"torch {torch.__version__}: column after all_reduce {m[:, 1].tolist()} (expected [3, 12, 21, 30]); "
              f"matrix {m.tolist()}")


if __name__ == "__main__":
    spawn(body, 2)
