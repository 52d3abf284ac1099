"""TEST DOUBLE, imported as a rank's setup module: torch's allocation-backend rule for symmetric memory,
on a CPU rank.

torch 2.13 documents that ``set_backend`` "cannot be changed once a symmetric memory tensor has been
allocated" and enforces it on CUDA ("Backend can not be changed after use"). A CPU build has no
allocation backend at all, so a harness that chose the backend too late (after a test allocated)
would pass here and fail on the first GPU. This module wraps ``set_backend``/``get_backend``/``empty``
of ``torch.distributed._symmetric_memory`` in the rank process with that rule and records every call,
so the project's tests can run the real suite's rank functions in one pool and see the order.
``empty`` still calls torch's own, which raises on CPU with torch's words.
"""

from __future__ import annotations

import torch.distributed._symmetric_memory as symm_mem

CALLS: list[tuple] = []
_state = {"backend": None, "used": False}
_real_empty = symm_mem.empty


def set_backend(name):
    CALLS.append(("set_backend", name))
    if _state["used"] and name != _state["backend"]:
        raise RuntimeError("Backend can not be changed after use")
    _state["backend"] = name


def get_backend(device):
    return _state["backend"]


def empty(*args, **kwargs):
    CALLS.append(("empty",))
    _state["used"] = True
    return _real_empty(*args, **kwargs)


symm_mem.set_backend, symm_mem.get_backend, symm_mem.empty = set_backend, get_backend, empty
