"""Stands in for an out-of-tree package (like torch_npu registering hccl): importing it registers a
distributed backend named ``conformance_loopback``, implemented by gloo underneath."""

import torch.distributed as dist

NAME = "conformance_loopback"


def _create(store, rank, world_size, timeout):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


if NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(NAME, _create, devices=["cpu"])
