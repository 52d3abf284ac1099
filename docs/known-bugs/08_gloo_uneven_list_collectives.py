"""gloo's list all_to_all needs equal chunks and its list all_gather equal sizes (known bug 8).

Report text (ready to file at pytorch/pytorch):

    Title: ProcessGroupGloo: list all_to_all and all_gather refuse tensors of different sizes

    dist.all_to_all(output_list, input_list) with chunks of different sizes, and dist.all_gather(list,
    tensor) with a different size on every rank, raise on gloo ("ProcessGroupGloo::alltoall: invalid
    tensor size at index 1", "ProcessGroupGloo::allgather: invalid tensor size at index 1"). NCCL
    takes both, and gloo's all_to_all_single takes uneven splits. Expected: gloo accepts them too, or
    the documentation states the restriction.

    Reproduce: python 08_gloo_uneven_list_collectives.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/08_gloo_uneven_list_collectives.py``.
"""

import torch
import torch.distributed as dist

from _ranks import attempt, spawn


def body(rank, world):
    send = [torch.zeros(1 + rank + d) for d in range(world)]      # rank r sends r + d + 1 rows to rank d
    recv = [torch.empty(1 + s + rank) for s in range(world)]
    for what, call in (("all_to_all", lambda: dist.all_to_all(recv, send)),
                       ("all_gather", lambda: dist.all_gather([torch.empty(3 + s) for s in range(world)],
                                                              torch.zeros(3 + rank)))):
        got = attempt(call)
        if rank == 0:
            print(f"torch {torch.__version__}: uneven list {what}: {got}")


if __name__ == "__main__":
    spawn(body, 2)
