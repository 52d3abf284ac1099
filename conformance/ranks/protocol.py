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
import pickle
import signal

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
    return pickle.dumps((name, kwargs), protocol=pickle.HIGHEST_PROTOCOL)


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
