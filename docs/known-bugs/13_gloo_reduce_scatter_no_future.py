"""gloo's reduce_scatter work handles have no future (known bug 13).

Report text (ready to file at pytorch/pytorch):

    Title: ProcessGroupGloo: reduce_scatter(async_op=True).get_future() raises "Work::getFuture not implemented"

    Every other gloo collective's work handle returns a future from get_future(); reduce_scatter's and
    reduce_scatter_tensor's raise "Work::getFuture not implemented", so code that chains on futures
    (DDP comm hooks, FSDP) cannot use them on gloo. Expected: a future completed with the output.

    Reproduce: python 13_gloo_reduce_scatter_no_future.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/13_gloo_reduce_scatter_no_future.py``.
"""

import torch
import torch.distributed as dist

from _ranks import attempt, spawn


def body(rank, world):
    out = torch.empty(2)
    work = dist.reduce_scatter_tensor(out, torch.ones(2 * world), async_op=True)
    work.wait()
    got = attempt(lambda: work.get_future().wait())
    if rank == 0:
        print(f"torch {torch.__version__}: reduce_scatter_tensor work.get_future(): {got}")


if __name__ == "__main__":
    spawn(body, 2)
