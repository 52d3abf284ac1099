"""DTensor argmax/argmin with dim=None pick the first *rank* holding the extreme, not the first index
(known bug 1).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor argmax/argmin (dim=None) return a later index when the extreme is tied across shards

    torch.distributed.tensor's argmax/argmin handler (_nonlinear_redux.py, argminmax_handler) reduces
    each shard to (value, global index), gathers the pairs and takes argmax over the gathered values:
    when several shards hold the extreme, the winner is the first rank holding it, which is not the
    smallest global index once a tensor dim other than the first is sharded. Eager returns the first
    occurrence.

        t = torch.tensor([[0., 0, 0, 9], [9, 0, 0, 0]])       # eager t.argmax() == 3
        distribute_tensor(t, mesh, [Shard(1)]).argmax()        # tensor(4)

    Reproduce: python 01_dtensor_argmax_ties_across_shards.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/01_dtensor_argmax_ties_across_shards.py``.
"""

import torch

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    t = torch.tensor([[0., 0, 0, 9], [9, 0, 0, 0]])
    got = outcome(lambda: distribute_tensor(t, mesh(), [Shard(1)]).argmax())
    if rank == 0:
        print(f"torch {torch.__version__}: DTensor argmax {got}; eager {t.argmax()!r}")


if __name__ == "__main__":
    spawn(body, 2)
