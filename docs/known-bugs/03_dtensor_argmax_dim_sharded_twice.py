"""DTensor argmax over a tensor dim sharded on both mesh dims gathers in mesh order (known bug 3).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor argmax/argmin with [Shard(0), Shard(0)] on a 2-D mesh break ties by mesh order

    On a 2 x 2 mesh with placements [Shard(0), Shard(0)], argmax(dim=0) gathers the per-shard
    candidates in mesh order, not in global order, so a tie goes to a later index than eager's first.

        t = torch.tensor([[1., 0], [3, 3], [0, 3], [3, 1]])                    # eager argmax(0): [1, 1]
        distribute_tensor(t, mesh2x2, [Shard(0), Shard(0)]).argmax(dim=0)     # [1, 2]

    Reproduce: python 03_dtensor_argmax_dim_sharded_twice.py (4 gloo ranks on one machine).

Run: ``python docs/known-bugs/03_dtensor_argmax_dim_sharded_twice.py``.
"""

import torch

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    t = torch.tensor([[1., 0], [3, 3], [0, 3], [3, 1]])
    got = outcome(lambda: distribute_tensor(t, mesh((2, 2)), [Shard(0), Shard(0)]).argmax(dim=0))
    if rank == 0:
        print(f"torch {torch.__version__}: DTensor argmax(dim=0) {got}; eager {t.argmax(dim=0)!r}")


if __name__ == "__main__":
    spawn(body, 4)
