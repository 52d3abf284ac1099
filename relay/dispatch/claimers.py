"""Who holds a dispatch's claim: an id for ``claimed_by`` that another process on the same machine can
check, and which claims belong to a process known dead, so its rows are due again at once instead of at
the end of their lease (``RELAY_DISPATCH_LEASE_SECONDS``).

An id is ``<scope>.<pid>.<start>.<random>``. ``scope`` names the machine's boot and the PID namespace,
the only place where a pid means one process; ``start`` is that process's start time (clock ticks after
boot, from ``/proc``), so a pid the kernel gave to a later process does not pass for the claimer;
``random`` keeps ids unique. A claim is known dead only when its scope is this process's and its pid is
gone or started at another time; a claim from another machine or container waits for its lease, as
before. Without ``/proc`` (not Linux) ids are random and nothing is known dead.
"""

from __future__ import annotations

import functools
import hashlib
import os
import uuid
from pathlib import Path

__all__ = ["known_dead", "own_claimer"]


@functools.lru_cache(maxsize=1)
def _scope() -> str | None:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:12]


def _start_ticks(pid: int) -> int | None:
    """The process's start time after boot in clock ticks; None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (the command) is in parentheses and may hold spaces; starttime is field 22.
    return int(stat.rsplit(")", 1)[1].split()[19])


def own_claimer() -> str:
    """This process's claimer id (under 64 characters, the column's size)."""
    scope, start = _scope(), _start_ticks(os.getpid())
    if scope is None or start is None:
        return uuid.uuid4().hex[:12]
    return f"{scope}.{os.getpid()}.{start}.{uuid.uuid4().hex[:8]}"


def known_dead(claimer: str) -> bool:
    """True only when ``claimer`` names a process of this machine's boot and PID namespace that no
    longer runs (its pid is gone, or held by a process that started at another time)."""
    parts = claimer.split(".")
    if len(parts) != 4 or _scope() is None or parts[0] != _scope() or not (parts[1].isdigit() and parts[2].isdigit()):
        return False
    return _start_ticks(int(parts[1])) != int(parts[2])
