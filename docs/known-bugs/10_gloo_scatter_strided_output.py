"""gloo's scatter leaves a strided output view unwritten (known bug 10; upstream:
https://github.com/pytorch/pytorch/issues/24836).

Run: ``python docs/known-bugs/10_gloo_scatter_strided_output.py``.
"""

import torch
import torch.distributed as dist

from _ranks import spawn


def body(rank, world):
    out = torch.full((4, 3), -1.)
    chunks = [torch.full((4,), float(r)) for r in range(world)] if rank == 0 else None
    dist.scatter(out[:, 1], chunks, src=0)
    print(f"torch {torch.__version__}: rank {rank}: output column {out[:, 1].tolist()} (expected {[float(rank)] * 4})")


if __name__ == "__main__":
    spawn(body, 2)
