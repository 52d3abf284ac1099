"""split_group needs a device-bound default group, which a CPU gloo group never is (known bug 14).

Report text (ready to file at pytorch/pytorch):

    Title: dist.split_group fails on a CPU (gloo) default group: "No device associated with the default pg"

    torch.distributed.split_group requires the parent group to be bound to a device (init_process_group
    with device_id). A gloo group on CPU has no device, so split_group cannot be used there at all,
    while new_group and new_subgroups work. Expected: split_group works on CPU groups, or the error says
    that only device-bound groups can be split and how to get one.

    Reproduce: python 14_split_group_needs_device.py (2 gloo ranks on one machine).

Run: ``python docs/known-bugs/14_split_group_needs_device.py``.
"""

import torch
import torch.distributed as dist

from _ranks import attempt, spawn


def body(rank, world):
    got = attempt(lambda: dist.split_group(split_ranks=[[0], [1]]))
    if rank == 0:
        print(f"torch {torch.__version__}: split_group on a gloo CPU group: {got}")


if __name__ == "__main__":
    spawn(body, 2)
