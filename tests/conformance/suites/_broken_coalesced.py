"""A deliberately broken coalesced collective for the ``uneven_coalesced`` suite: a ``BrokenDist`` whose
``group.WORLD`` is the real process group except for ``allgather_into_tensor_coalesced``."""

from __future__ import annotations

from tests.conformance.suites._broken_dist import BrokenDist, _dist


class _FirstTensorOnly:
    """The world's process group, except that allgather_into_tensor_coalesced gathers only the first
    tensor of the list (the others are left as they were)."""

    def __getattr__(self, name):
        return getattr(_dist().group.WORLD, name)

    def allgather_into_tensor_coalesced(self, outputs, inputs, *args):
        return _dist().group.WORLD.allgather_into_tensor_coalesced(outputs[:1], inputs[:1], *args)


class _Groups:
    WORLD = _FirstTensorOnly()


COALESCED_GATHERS_FIRST_ONLY = BrokenDist(group=_Groups())
