"""DTensor argmax/argmin return a later NaN than the first (known bug 2).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor argmax/argmin (dim=None) do not return the first NaN when NaNs are in several shards

    Eager argmax/argmin return the index of the first NaN. DTensor's handler (_nonlinear_redux.py,
    argminmax_handler) picks the first *rank* holding a NaN, which is a later index when a dim other
    than the first is sharded (the same cause as ties across shards).

        n = torch.tensor([[0., 0, 0, nan], [nan, 0, 0, 0]])   # eager n.argmax() == 3
        distribute_tensor(n, mesh, [Shard(1)]).argmax()        # tensor(4)

    Reproduce: python 02_dtensor_argmax_nan_order.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/02_dtensor_argmax_nan_order.py``.
"""

import torch

from _dtensor import mesh, outcome
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    nan = float("nan")
    n = torch.tensor([[0., 0, 0, nan], [nan, 0, 0, 0]])
    got = outcome(lambda: distribute_tensor(n, mesh(), [Shard(1)]).argmax())
    if rank == 0:
        print(f"torch {torch.__version__}: DTensor argmax {got}; eager {n.argmax()!r}")


if __name__ == "__main__":
    spawn(body, 2)
