"""The pool's wire vocabulary: every message is a ``(name, kwargs)`` pair over one socket per rank.

Controller -> rank: ``call`` (run a function, numbered by ``call``), ``reset_group`` (start a fresh process
group), ``shutdown``.
Rank -> controller: ``ready`` (process group up; with its device's name and probes from a rank whose
config says ``describe``), ``result`` and ``error`` (a remote exception with its
traceback), both carrying the number of the call they answer, ``group_ready`` (after a reset),
``init_failed`` (start-up failed, with the traceback).
Out of band, controller -> rank: ``STACKS_SIGNAL`` makes a rank write every thread's Python stack to its
log (faulthandler's handler, which runs even while the rank is blocked in C++), read when a call hangs.
A rank whose socket closes is gone: the controller sees that as ``RANK_GONE``. A reply the controller
cannot unpickle becomes an ``error`` of that rank (``UNREADABLE``); the stream stays in step because
the whole message was read first.
"""

from __future__ import annotations

import enum
import io
import pickle
import signal
import sys

# controller -> rank
CALL = "call"
RESET_GROUP = "reset_group"
SHUTDOWN = "shutdown"

STACKS_SIGNAL = signal.SIGUSR1

# rank -> controller
READY = "ready"
RESULT = "result"
ERROR = "error"
GROUP_READY = "group_ready"
INIT_FAILED = "init_failed"


UNREADABLE = "UnreadableReply"  # exc_type of the error a reply that cannot be unpickled becomes


class Marker(enum.Enum):
    RANK_GONE = "rank_gone"


RANK_GONE = Marker.RANK_GONE


def encode(name: str, **kwargs) -> bytes:
    """A message as the bytes ``send`` sends (for one message to many ranks, pickled once)."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump((name, kwargs))
    return out.getvalue()


class _Pickler(pickle.Pickler):
    """Pickles a plain dense CPU tensor as its dtype, shape and bytes (``_tensor_from_bytes``): torch's own
    reduction saves and loads every storage with ``torch.save``/``torch.load``, about 0.1 ms each way per
    small tensor against 0.007 ms, and the DTensor matrices send thousands. Any other tensor (a view into
    a larger storage, non-contiguous, requiring grad, named, quantized, conjugated, a subclass, on another
    device) keeps torch's reduction, which preserves what this form would not."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        try:
            plain = (obj.layout == torch.strided and obj.device.type == "cpu" and not obj.requires_grad
                     and obj.is_contiguous() and obj.storage_offset() == 0
                     and obj.untyped_storage().nbytes() == obj.numel() * obj.element_size()
                     and not (obj.is_quantized or obj.is_conj() or obj.is_neg())
                     and not any(getattr(obj, "names", None) or ()))  # named tensors, where torch has them
            if not plain:
                return NotImplemented
            raw = obj.reshape(-1).view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError):  # e.g. torch built without numpy: torch's reduction
            return NotImplemented
        return _tensor_from_bytes, (str(obj.dtype).removeprefix("torch."), tuple(obj.shape), raw)


def _tensor_from_bytes(dtype: str, shape: tuple, raw: bytes):
    """The tensor ``_Pickler`` sent: ``shape`` of ``dtype``, from its bytes (writable, its own memory), on
    the CPU whatever the default device (a rank's is ``meta`` outside its functions)."""
    import torch

    if not raw:
        return torch.empty(shape, dtype=getattr(torch, dtype), device="cpu")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)


def send(conn, name: str, **kwargs) -> None:
    """Send with plain pickle: torch's multiprocessing reducers would share tensors through file
    descriptors and an auth handshake that our rank processes are not part of; copying is simpler."""
    conn.send_bytes(encode(name, **kwargs))


def recv(conn) -> tuple[str, dict]:
    return pickle.loads(conn.recv_bytes())


def recv_or_unreadable(conn) -> tuple[str, dict]:
    """``recv``, except that a message that cannot be unpickled (a class only the rank can import, a
    dtype torch cannot unpickle) becomes an ``error``: the bytes are consumed either way."""
    data = conn.recv_bytes()
    try:
        return pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is this reply's error
        return ERROR, {"exc_type": UNREADABLE, "call": None, "traceback": "",
                       "message": f"its reply ({len(data)} bytes) could not be unpickled here: "
                                  f"{type(exc).__name__}: {exc}"}
