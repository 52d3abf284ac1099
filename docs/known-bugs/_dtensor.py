"""Shared by the DTensor repro scripts here: a 1-D (or 2 x 2) CPU mesh over gloo and what eager gives."""

from __future__ import annotations


def mesh(shape=(2,)):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape)


def outcome(fn):
    """fn()'s value (a full tensor), or the error it raised, as text."""
    try:
        value = fn()
        return repr(value.full_tensor() if hasattr(value, "full_tensor") else value)
    except Exception as exc:  # noqa: BLE001 - the error is the observation
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
