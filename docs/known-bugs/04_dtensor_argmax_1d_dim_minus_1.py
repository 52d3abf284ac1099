"""DTensor argmax of a sharded vector along dim=-1 crashes in the handler's reshape (known bug 4).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor argmax/argmin(dim=-1) of a sharded 1-D tensor raise "shape '[1, 4, 2]' is invalid"

    A 1-D DTensor sharded on its only dim, reduced with dim=-1 (not dim=0), fails in
    _nonlinear_redux.py's reshape of the gathered candidates; with dim=0 it works, and eager answers.

        v = torch.arange(8.)
        distribute_tensor(v, mesh, [Shard(0)]).argmax(dim=-1)   # RuntimeError: shape '[1, 4, 2]' is invalid
                                                                 # for input of size 2; eager: tensor(7)

    Reproduce: python 04_dtensor_argmax_1d_dim_minus_1.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/04_dtensor_argmax_1d_dim_minus_1.py``.
"""

import torch

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    v = torch.arange(8.)
    got = outcome(lambda: distribute_tensor(v, mesh(), [Shard(0)]).argmax(dim=-1))
    if rank == 0:
        print(f"torch {torch.__version__}: DTensor argmax(dim=-1) {got}; eager {v.argmax(dim=-1)!r}")


if __name__ == "__main__":
    spawn(body, 2)
