"""What a function running on a rank receives as its first argument."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RankContext:
    """rank, world size, the device this rank uses, the distributed backend name, the default process
    group, the backend descriptor's name and a directory shared by every rank of the pool."""

    rank: int
    world_size: int
    device: Any  # torch.device; typed loosely so this module imports no torch
    backend: str
    descriptor: str
    shared_dir: str
    group: Any = None

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1
