"""TEST DOUBLE: a CPU reference implementation of symmetric memory, and deliberately broken variants.

Not a backend and never reported as one: the project's own tests hand these classes (by import
path, e.g. ``"tests.suites.symm_reference:ReferenceSymmetricMemory"``) to the symmetric-memory suite's
bodies, which run in the rank processes of a real gloo pool. The bodies cannot run on real symmetric
memory here (torch has none for CPU), so this shows they pass on a correct implementation of the
semantics and fail on each bug below.

How the reference works, per rank: ``allocate`` maps a file in the pool's shared directory
(``torch.from_file(shared=True)``), so every rank can map every other rank's buffer. ``rendezvous``
gives the buffer a signal pad, exchanges file names over the gloo group, maps the peers' buffers and
pads, and unlinks its own files once everyone has mapped them (nothing is left behind). A signal pad
row belongs to one writer only: ``posted[src]`` in rank r's pad is incremented only by ``src``'s
``put_signal``, ``consumed[src]`` only by rank r's ``wait_signal``, so no two processes write the
same word and a signal is consumed exactly once. ``put_signal`` copies the data before it bumps the
counter; x86's total store order keeps that order visible to the reader.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NoWaitSymmetricMemory", "ReferenceSymmetricMemory", "StaleSignalSymmetricMemory",
           "UncheckedPeerSymmetricMemory", "WrongPeerSymmetricMemory"]

POSTED, CONSUMED = 0, 1


@dataclass
class ReferenceHandle:
    rank: int
    world_size: int
    buffers: list   # every rank's buffer, mapped into this process
    pads: list      # every rank's signal pad: int64 [2, world] (posted, consumed) by source rank
    device: object


class ReferenceSymmetricMemory:
    """Shared-file buffers and a signal pad between the pool's rank processes (see the module)."""

    name = "reference"
    wait_timeout = 3.0  # a wait that sees no signal fails instead of hanging the pool

    def __init__(self, ctx):
        self.ctx = ctx
        self.dir = Path(ctx.shared_dir) / "symm-reference"
        self.dir.mkdir(exist_ok=True)
        self._files: dict[int, Path] = {}  # data_ptr of an allocated tensor -> its backing file

    def _map(self, path: Path, numel: int, dtype):
        import torch

        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype, device=self.ctx.device)

    def allocate(self, shape, dtype):
        import math

        path = self.dir / f"{uuid.uuid4().hex}-r{self.ctx.rank}.buf"
        tensor = self._map(path, math.prod(shape), dtype).view(*shape)
        self._files[tensor.data_ptr()] = path
        return tensor

    def rendezvous(self, tensor):
        import torch
        import torch.distributed as dist

        path = self._files.get(tensor.data_ptr())
        if path is None:
            raise ValueError("rendezvous: the tensor was not allocated by symmetric memory (allocate); "
                             "a plain tensor is not symmetric and cannot be shared with peers")
        world, rank = self.ctx.world_size, self.ctx.rank
        pad_path = path.with_suffix(".pad")
        pad = self._map(pad_path, 2 * world, torch.int64).view(2, world)
        pad.zero_()
        mine = (str(path), str(pad_path), tuple(tensor.shape), str(tensor.dtype))
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=self.ctx.group)
        for peer, (_, _, shape, dtype) in enumerate(everyone):
            if shape != mine[2] or dtype != mine[3]:
                raise ValueError(f"rendezvous: rank {peer} passed {shape} {dtype}, rank {rank} passed "
                                 f"{mine[2]} {mine[3]}: every rank must pass the same shape and dtype")
        buffers = [tensor if peer == rank else self._map(Path(p), tensor.numel(), tensor.dtype).view(tensor.shape)
                   for peer, (p, _, _, _) in enumerate(everyone)]
        pads = [pad if peer == rank else self._map(Path(p), 2 * world, torch.int64).view(2, world)
                for peer, (_, p, _, _) in enumerate(everyone)]
        dist.barrier(group=self.ctx.group)  # every peer has mapped our files: unlink them now
        os.unlink(path)
        os.unlink(pad_path)
        return ReferenceHandle(rank, world, buffers, pads, tensor.device)

    def _check_peer(self, op: str, hdl: ReferenceHandle, peer: int) -> None:
        if not 0 <= peer < hdl.world_size:
            raise ValueError(f"{op}: peer {peer} is not a rank of this group (0..{hdl.world_size - 1})")

    def _deliver(self, src, hdl: ReferenceHandle, peer: int) -> None:
        target = hdl.buffers[peer].view(-1)
        if src.numel() > target.numel() or src.dtype != target.dtype:
            raise ValueError(f"put_signal: source {tuple(src.shape)} {src.dtype} does not fit the peer's "
                             f"buffer {tuple(target.shape)} {target.dtype}")
        target[: src.numel()].copy_(src.reshape(-1))
        hdl.pads[peer][POSTED, hdl.rank] += 1

    def put_signal(self, src, hdl: ReferenceHandle, peer: int) -> None:
        self._check_peer("put_signal", hdl, peer)
        self._deliver(src, hdl, peer)

    def _arrived(self, hdl: ReferenceHandle, peer: int) -> bool:
        pad = hdl.pads[hdl.rank]
        return int(pad[POSTED, peer]) > int(pad[CONSUMED, peer])

    def _consume(self, hdl: ReferenceHandle, peer: int) -> None:
        hdl.pads[hdl.rank][CONSUMED, peer] += 1

    def wait_signal(self, hdl: ReferenceHandle, peer: int) -> None:
        self._check_peer("wait_signal", hdl, peer)
        deadline = time.monotonic() + self.wait_timeout
        while not self._arrived(hdl, peer):
            if time.monotonic() > deadline:
                raise TimeoutError(f"wait_signal: no signal from peer {peer} on rank {hdl.rank} "
                                   f"within {self.wait_timeout:g} s")
            time.sleep(0.0005)
        self._consume(hdl, peer)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.ctx.group)


# -- deliberately broken variants: each must make some suite body fail ------------------------------

class NoWaitSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``wait_signal`` returns at once, whether or not anything arrived."""

    name = "broken: wait that does not wait"

    def wait_signal(self, hdl, peer):
        self._check_peer("wait_signal", hdl, peer)


class WrongPeerSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``put_signal`` delivers to the next rank after the one asked for."""

    name = "broken: put to the wrong peer"

    def put_signal(self, src, hdl, peer):
        self._check_peer("put_signal", hdl, peer)
        self._deliver(src, hdl, (peer + 1) % hdl.world_size)


class StaleSignalSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: a signal is never consumed, so every later wait passes on the first one."""

    name = "broken: stale signal"

    def _arrived(self, hdl, peer):
        return int(hdl.pads[hdl.rank][POSTED, peer]) > 0

    def _consume(self, hdl, peer):
        pass


class UncheckedPeerSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: a peer outside the group is silently wrapped around instead of refused."""

    name = "broken: unchecked peer"

    def _check_peer(self, op, hdl, peer):
        pass

    def put_signal(self, src, hdl, peer):
        self._deliver(src, hdl, peer % hdl.world_size)
