"""What a function running on a rank receives as its first argument."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RankContext:
    """rank, world size, the device this rank uses, the distributed backend name, the default process
    group, the backend descriptor's name, a directory shared by every rank of the pool, and the
    symmetric-memory allocation backend chosen at start."""

    rank: int
    world_size: int
    device: Any  # torch.device; typed loosely so this module imports no torch
    backend: str
    descriptor: str
    shared_dir: str
    group: Any = None
    # The symmetric-memory allocation backend selected when the rank started (None: torch's default),
    # and torch's error if selecting it failed.
    symmetric_memory_backend: str | None = None
    symmetric_memory_backend_error: str | None = None
    node: str = "local"  # under a launcher: "node <GROUP_RANK> (<host>)"

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1
