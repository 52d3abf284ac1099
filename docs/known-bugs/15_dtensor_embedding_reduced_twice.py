"""A vocab-parallel embedding's output can be reduced only once (known bug 15; upstream reports the same
double reduction under compile: https://github.com/pytorch/pytorch/issues/160697).

Run: ``python docs/known-bugs/15_dtensor_embedding_reduced_twice.py``.
"""

import torch
import torch.nn.functional as F

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m = mesh()
    ids, w = torch.tensor([0, 3, 1, 2]), torch.arange(12.).view(4, 3)
    out = F.embedding(distribute_tensor(ids, m, [Replicate()]), distribute_tensor(w, m, [Shard(0)]))
    first, second = outcome(lambda: out), outcome(lambda: out)
    if rank == 0:
        print(f"torch {torch.__version__}: first full_tensor(): {first}\nsecond full_tensor(): {second}")


if __name__ == "__main__":
    spawn(body, 2)
