"""TEST DOUBLE: a CPU reference implementation of symmetric memory, and deliberately broken variants.

Not a backend and never reported as one: the project's own tests hand these classes (by import
path, e.g. ``"tests.conformance.suites.symm_reference:ReferenceSymmetricMemory"``) to the symmetric-memory suite's
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

``rendezvous(tensor, group)`` does the same over any process group (a sub-group maps only its
members' buffers, numbered by group rank) and caches the handle per buffer and group, as torch does.
As its files are unlinked after the first rendezvous, a buffer can be rendezvoused on one group only.
The collectives (one- and two-shot all_reduce, multimem all_reduce, low-contention all_gather and
reduce_scatter, fused_all_gather_matmul, get_remote_tensors) compute their result from the members'
mapped buffers between two barriers of the group, as torch's kernels do between their signal-pad
synchronisations; "multimem" is emulated by storing each reduced slice in every member's buffer.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LocalShardMatmulSymmetricMemory", "LocalStoreTwoShotSymmetricMemory", "NoMulticastSymmetricMemory",
           "NoWaitSymmetricMemory", "OtherChunkReduceScatterSymmetricMemory", "OutOfPlaceMultimemSymmetricMemory",
           "OwnBufferRemoteTensorsSymmetricMemory", "ReferenceSymmetricMemory", "ReversedAllGatherSymmetricMemory",
           "SkipPeerAllReduceSymmetricMemory", "StaleSignalSymmetricMemory", "UncheckedPeerSymmetricMemory",
           "WorldRendezvousSymmetricMemory", "WrongPeerSymmetricMemory"]

POSTED, CONSUMED = 0, 1


@dataclass
class ReferenceHandle:
    rank: int
    world_size: int
    buffers: list   # every rank's buffer, mapped into this process
    pads: list      # every rank's signal pad: int64 [2, world] (posted, consumed) by source rank
    device: object
    group: object = None  # the process group it was rendezvoused on
    multicast_ptr: int = 1  # the reference "multicasts" by writing every member's buffer


class ReferenceSymmetricMemory:
    """Shared-file buffers and a signal pad between the pool's rank processes (see the module)."""

    name = "reference"
    wait_timeout = 3.0  # a wait that sees no signal fails instead of hanging the pool

    def __init__(self, ctx):
        self.ctx = ctx
        self.dir = Path(ctx.shared_dir) / "symm-reference"
        self.dir.mkdir(exist_ok=True)
        self._files: dict[int, Path] = {}  # data_ptr of an allocated tensor -> its backing file
        # (data_ptr, group name) -> (tensor, handle); holding the tensor keeps its address from being reused
        self._handles: dict[tuple, tuple] = {}

    def _map(self, path: Path, numel: int, dtype):
        import torch

        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype, device=self.ctx.device)

    def allocate(self, shape, dtype):
        import math

        path = self.dir / f"{uuid.uuid4().hex}-r{self.ctx.rank}.buf"
        tensor = self._map(path, math.prod(shape), dtype).view(*shape)
        self._files[tensor.data_ptr()] = path
        return tensor

    def rendezvous(self, tensor, group=None):
        import torch
        import torch.distributed as dist

        group = self.ctx.group if group is None else group
        cached = self._handles.get((tensor.data_ptr(), group.group_name))
        if cached is not None:  # as torch: a buffer rendezvoused again on its group gets the same handle
            return cached[1]
        path = self._files.get(tensor.data_ptr())
        if path is None:
            raise ValueError("rendezvous: the tensor was not allocated by symmetric memory (allocate); "
                             "a plain tensor is not symmetric and cannot be shared with peers")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        pad_path = path.with_suffix(".pad")
        pad = self._map(pad_path, 2 * world, torch.int64).view(2, world)
        pad.zero_()
        mine = (str(path), str(pad_path), tuple(tensor.shape), str(tensor.dtype))
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
        for peer, (_, _, shape, dtype) in enumerate(everyone):
            if shape != mine[2] or dtype != mine[3]:
                raise ValueError(f"rendezvous: rank {peer} passed {shape} {dtype}, rank {rank} passed "
                                 f"{mine[2]} {mine[3]}: every rank must pass the same shape and dtype")
        buffers = [tensor if peer == rank else self._map(Path(p), tensor.numel(), tensor.dtype).view(tensor.shape)
                   for peer, (p, _, _, _) in enumerate(everyone)]
        pads = [pad if peer == rank else self._map(Path(p), 2 * world, torch.int64).view(2, world)
                for peer, (_, p, _, _) in enumerate(everyone)]
        dist.barrier(group=group)  # every peer has mapped our files: unlink them now
        os.unlink(path)
        os.unlink(pad_path)
        hdl = ReferenceHandle(rank, world, buffers, pads, tensor.device, group)
        self._handles[(tensor.data_ptr(), group.group_name)] = (tensor, hdl)
        return hdl

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

    # -- the collectives on symmetric buffers, computed from the members' mapped buffers ------------
    # Each one, as torch's ops: rendezvous the input on the group (a cached handle if it already is),
    # wait until every member has arrived (their inputs are written), read the peers' buffers, and
    # wait again before returning, so no member overwrites a buffer another is still reading.

    def _sync(self, hdl: ReferenceHandle) -> None:
        import torch.distributed as dist

        dist.barrier(group=hdl.group)

    @staticmethod
    def _reduce(tensors, reduce_op: str):
        import torch

        if reduce_op not in ("sum", "avg"):
            raise ValueError(f"reduce_op ({reduce_op}) is not supported")
        total = torch.stack(list(tensors)).sum(dim=0)
        return total / len(tensors) if reduce_op == "avg" else total

    def _reduce_of(self, hdl: ReferenceHandle, buffers, reduce_op: str):
        """``buffers`` (the members', or views of them) reduced once every member has arrived."""
        self._sync(hdl)
        out = self._reduce(buffers, reduce_op)
        self._sync(hdl)
        return out

    def one_shot_all_reduce(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        return self._reduce_of(hdl, hdl.buffers, reduce_op)

    def _reduce_in_place(self, hdl: ReferenceHandle, reduce_op: str, targets) -> None:
        """Two-shot: this rank reduces its slice of every member's buffer and stores it in ``targets``
        (every member's buffer), so after the second barrier every buffer holds the whole reduction."""
        self._sync(hdl)
        numel = hdl.buffers[hdl.rank].numel()
        per_rank = -(-numel // hdl.world_size)
        lo, hi = min(numel, per_rank * hdl.rank), min(numel, per_rank * (hdl.rank + 1))
        part = self._reduce([b.view(-1)[lo:hi] for b in hdl.buffers], reduce_op)
        for buffer in targets:
            buffer.view(-1)[lo:hi].copy_(part)
        self._sync(hdl)

    def two_shot_all_reduce_(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        self._reduce_in_place(hdl, reduce_op, hdl.buffers)
        return tensor

    def multimem_all_reduce_(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        if not hdl.multicast_ptr:
            raise RuntimeError("multimem_all_reduce_: multicast support is required.")
        self._reduce_in_place(hdl, reduce_op, hdl.buffers)  # one "multicast" store per slice
        return tensor

    def _concat(self, hdl: ReferenceHandle, dim: int, order=None):
        """The members' buffers (in ``order``, default rank order) concatenated along ``dim``."""
        import torch

        self._sync(hdl)
        out = torch.cat([hdl.buffers[r].clone() for r in (order or range(hdl.world_size))], dim=dim)
        self._sync(hdl)
        return out

    def low_contention_all_gather(self, tensor, group=None):
        return self._concat(self.rendezvous(tensor, group), 0)

    def _reduce_chunk(self, hdl: ReferenceHandle, chunk: int, reduce_op: str):
        """Chunk ``chunk`` (of group-size chunks along dim 0) of every member's buffer, reduced."""
        return self._reduce_of(hdl, [b.chunk(hdl.world_size)[chunk] for b in hdl.buffers], reduce_op)

    def low_contention_reduce_scatter(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        return self._reduce_chunk(hdl, hdl.rank, reduce_op)

    def _gather(self, A, gather_dim: int, group):
        """``A`` copied into a symmetric workspace (torch's op does the same for a plain ``A``) and every
        member's workspace concatenated along ``gather_dim``."""
        work = self.allocate(tuple(A.shape), A.dtype)
        work.copy_(A)
        return self._concat(self.rendezvous(work, group), gather_dim)

    def fused_all_gather_matmul(self, A, Bs, gather_dim=0, return_A=True, group=None):
        gathered = self._gather(A, gather_dim, group)
        return (gathered if return_A else None), [gathered @ B for B in Bs]

    def get_remote_tensors(self, tensor, group=None):
        return list(self.rendezvous(tensor, group).buffers)

    def unsupported(self, op, hdl=None):
        return None


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


class SkipPeerAllReduceSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``one_shot_all_reduce`` leaves out the last member's buffer."""

    name = "broken: one-shot all_reduce that skips a peer"

    def one_shot_all_reduce(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        return self._reduce_of(hdl, hdl.buffers[:-1] or hdl.buffers, reduce_op)


class LocalStoreTwoShotSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``two_shot_all_reduce_`` stores each reduced slice in its own buffer only, so every other
    slice keeps this rank's input."""

    name = "broken: two-shot all_reduce that stores its slice locally"

    def two_shot_all_reduce_(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        self._reduce_in_place(hdl, reduce_op, [tensor])
        return tensor


class OutOfPlaceMultimemSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``multimem_all_reduce_`` returns the reduction in a new tensor and leaves its input as it was."""

    name = "broken: multimem all_reduce that is not in place"

    def multimem_all_reduce_(self, tensor, reduce_op="sum", group=None):
        return self.one_shot_all_reduce(tensor, reduce_op, group)


class NoMulticastSymmetricMemory(ReferenceSymmetricMemory):
    """Not a bug: a machine without multicast, where the multimem test must skip saying why."""

    name = "reference without multicast"

    def unsupported(self, op, hdl=None):
        if op == "multimem_all_reduce_":
            return "multimem_all_reduce_ needs multicast: this reference has none"
        return None


class ReversedAllGatherSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``low_contention_all_gather`` concatenates the members' buffers in reverse rank order."""

    name = "broken: all_gather in the wrong rank order"

    def low_contention_all_gather(self, tensor, group=None):
        hdl = self.rendezvous(tensor, group)
        return self._concat(hdl, 0, list(reversed(range(hdl.world_size))))


class OtherChunkReduceScatterSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``low_contention_reduce_scatter`` returns the next rank's chunk of the reduction."""

    name = "broken: reduce_scatter that returns another rank's chunk"

    def low_contention_reduce_scatter(self, tensor, reduce_op="sum", group=None):
        hdl = self.rendezvous(tensor, group)
        return self._reduce_chunk(hdl, (hdl.rank + 1) % hdl.world_size, reduce_op)


class LocalShardMatmulSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``fused_all_gather_matmul`` gathers ``A`` but multiplies only the local shard."""

    name = "broken: fused_all_gather_matmul that multiplies only the local shard"

    def fused_all_gather_matmul(self, A, Bs, gather_dim=0, return_A=True, group=None):
        gathered = self._gather(A, gather_dim, group)
        return (gathered if return_A else None), [A @ B for B in Bs]


class OwnBufferRemoteTensorsSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``get_remote_tensors`` returns this rank's own buffer for every peer."""

    name = "broken: get_remote_tensors that returns the local buffer"

    def get_remote_tensors(self, tensor, group=None):
        return [tensor] * self.rendezvous(tensor, group).world_size


class WorldRendezvousSymmetricMemory(ReferenceSymmetricMemory):
    """Bug: ``rendezvous`` on a sub-group maps the world's ranks instead of the group's."""

    name = "broken: sub-group rendezvous that maps the world"

    def rendezvous(self, tensor, group=None):
        return super().rendezvous(tensor, None)
