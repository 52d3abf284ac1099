"""A DTensor split into pieces, only one reaching the loss: backward fails (known bug 20).

Report text (ready to file at pytorch/pytorch):

    Title: DTensor backward through split/unbind fails when a piece is unused: "aten.cat.default got mixed
    torch.Tensor and DTensor"

    When a DTensor is split (torch.split, chunk) or unbound and only some pieces reach the loss, the
    unused pieces' gradients are None. split_with_sizes_backward and unbind_backward
    (torch/csrc/autograd/FunctionsManual.cpp) fill them in with at::zeros of the piece's size, a plain
    tensor, and join them with the DTensor gradients of the used pieces: aten.cat (aten.stack for unbind)
    then refuses the mix ("got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor
    before calling distributed operators!"). The same code on plain tensors gives 1 on the used rows and 0
    elsewhere. Expected: the zeros are made like the gradient that is defined (zeros_like of a DTensor
    gradient, or a DTensor of zeros with the used piece's placements), so backward works as for plain
    tensors. Seen on torch 2.13.0, 2.14.1 and 2.15.0.

    Reproduce: python 20_dtensor_unused_split_output.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/20_dtensor_unused_split_output.py``.
"""

import torch

from _dtensor import mesh
from _ranks import attempt, spawn


def body(rank, world):
    from torch.distributed.tensor import Shard, distribute_tensor

    m = mesh()
    results = {}
    for how in ("split", "unbind"):
        x = distribute_tensor(torch.ones(4, 2 * world), m, [Shard(1)]).requires_grad_()
        first = torch.split(x, 2, dim=0)[0] if how == "split" else x.unbind(0)[0]
        results[how] = attempt(lambda: first.to_local().sum().backward())
    plain = torch.ones(4, 2 * world, requires_grad=True)
    torch.split(plain, 2, dim=0)[0].sum().backward()
    if rank == 0:
        print(f"torch {torch.__version__}: backward through a DTensor's first split piece: {results['split']}; "
              f"its first unbound row: {results['unbind']}; the same split of a plain tensor gives "
              f"{plain.grad[:, 0].tolist()} down a column")


if __name__ == "__main__":
    spawn(body, 2)
