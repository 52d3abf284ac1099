"""The pool's wire vocabulary: every message is a ``(name, kwargs)`` pair over one socket per rank.

Controller -> rank: ``call`` (run a function), ``reset_group`` (start a fresh process group), ``shutdown``.
Rank -> controller: ``ready`` (process group up), ``result``, ``error`` (a remote exception with its
traceback), ``group_ready`` (after a reset), ``init_failed`` (start-up failed, with the traceback).
A rank whose socket closes is gone: the controller sees that as ``RANK_GONE``.
"""

from __future__ import annotations

import enum
import pickle

# controller -> rank
CALL = "call"
RESET_GROUP = "reset_group"
SHUTDOWN = "shutdown"

# rank -> controller
READY = "ready"
RESULT = "result"
ERROR = "error"
GROUP_READY = "group_ready"
INIT_FAILED = "init_failed"


class Marker(enum.Enum):
    RANK_GONE = "rank_gone"


RANK_GONE = Marker.RANK_GONE


def send(conn, name: str, **kwargs) -> None:
    """Send with plain pickle: torch's multiprocessing reducers would share tensors through file
    descriptors and an auth handshake that our rank processes are not part of; copying is simpler."""
    conn.send_bytes(pickle.dumps((name, kwargs), protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn) -> tuple[str, dict]:
    return pickle.loads(conn.recv_bytes())
