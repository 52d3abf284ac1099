"""Runs a function on N local gloo ranks (torch.multiprocessing, spawn) for the repro scripts here:
``spawn(fn, world_size=2)`` calls ``fn(rank, world_size)`` in every rank after ``init_process_group``;
``attempt(fn)`` says what a call did ("worked", or its error's first line)."""

from __future__ import annotations

import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, fn, world_size: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size)
    finally:
        dist.destroy_process_group()


def attempt(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error is the observation
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "worked"


def spawn(fn, world_size: int = 2) -> None:
    import torch.multiprocessing as mp

    sys.stdout.reconfigure(line_buffering=True)
    mp.start_processes(_rank, args=(fn, world_size, _free_port()), nprocs=world_size, start_method="spawn")
