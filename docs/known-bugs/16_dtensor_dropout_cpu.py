"""Dropout masks repeat across shards on CPU meshes (known bug 16).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor dropout on a CPU mesh draws the same mask on every shard

    DTensor's offset-based RNG tracker (torch/distributed/tensor/_random.py) runs only on accelerator
    meshes. On a CPU mesh each rank draws from its own generator, and since DTensor asks for the same
    seed on every rank, a Shard(0) input gets one mask repeated on every shard: the full tensor's mask
    is periodic, unlike eager dropout on the full tensor. Expected: distinct masks per shard (the
    tracker on CPU too), or a warning that CPU meshes do not get DTensor's RNG semantics.

    Reproduce: python 16_dtensor_dropout_cpu.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/16_dtensor_dropout_cpu.py``.
"""

import torch
import torch.nn.functional as F

from _dtensor import mesh
from _ranks import spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    x = distribute_tensor(torch.ones(8, 16), mesh(), [Shard(0)])
    mask = (F.dropout(x, p=0.5).full_tensor() != 0).int()
    if rank == 0:
        same = torch.equal(mask[:4], mask[4:])
        print(f"torch {torch.__version__}: the two shards' dropout masks are {'the same' if same else 'different'}")


if __name__ == "__main__":
    spawn(body, 2)
