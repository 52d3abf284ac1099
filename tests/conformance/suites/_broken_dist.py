"""Deliberately broken stand-ins for ``torch.distributed``, handed to the collectives suites by import path.

Each is a ``BrokenDist``: every function is torch.distributed's own except the one or two it replaces,
each wrong in one way. The suites' rank functions import this module on every rank
(``impl="tests.conformance.suites._broken_dist:NAME"``) and run over the same real process group.
"""

from __future__ import annotations

class BrokenDist:
    """torch.distributed with some functions replaced (``overrides``: name -> function)."""

    def __init__(self, **overrides):
        self._overrides = overrides

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        import torch.distributed

        return getattr(torch.distributed, name)


def _dist():
    import torch.distributed

    return torch.distributed


def _all_gather_rotated(tensor_list, tensor, group=None, async_op=False):
    """Every rank's data lands one slot later."""
    work = _dist().all_gather(tensor_list, tensor, group=group, async_op=async_op)
    moved = [t.clone() for t in tensor_list]
    for i, t in enumerate(tensor_list):
        t.copy_(moved[i - 1])
    return work


def _gather_dropping_last(tensor, gather_list=None, dst=0, group=None, async_op=False):
    """The last rank's contribution never arrives: its slot is left zero."""
    work = _dist().gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)
    if gather_list:
        gather_list[-1].zero_()
    return work


def _reduce_to_next(tensor, dst=None, op=None, group=None, async_op=False):
    dist = _dist()
    return dist.reduce(tensor, dst=(dst + 1) % dist.get_world_size(), op=op if op is not None else dist.ReduceOp.SUM,
                       group=group, async_op=async_op)


def _broadcast_from_next(tensor, src=None, group=None, async_op=False):
    dist = _dist()
    return dist.broadcast(tensor, src=(src + 1) % dist.get_world_size(), group=group, async_op=async_op)


def _reduce_scatter_always_sum(output, input_list, op=None, group=None, async_op=False):
    dist = _dist()
    return dist.reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


class _DoneWork:
    """A handle that claims to be done at once."""

    def __init__(self, value):
        self._value = value

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        import torch

        future = torch.futures.Future()
        future.set_result(self._value)
        return future


def _all_reduce_wait_does_not_wait(tensor, op=None, group=None, async_op=False):
    """With async_op, the reduction runs on a copy that reaches the caller's tensor only later
    (here: never); wait() returns at once."""
    dist = _dist()
    op = op if op is not None else dist.ReduceOp.SUM
    if not async_op:
        return dist.all_reduce(tensor, op=op, group=group)
    copy = tensor.clone()
    dist.all_reduce(copy, op=op, group=group)
    return _DoneWork([copy])


def _all_gather_object_reversed(object_list, obj, group=None):
    _dist().all_gather_object(object_list, obj, group=group)
    object_list.reverse()


def _all_gather_into_tensor_flat_write(output_tensor, input_tensor, group=None, async_op=False):
    """Gathers into a contiguous buffer, then writes it back over the output's storage as if the
    output were contiguous: right for contiguous outputs, wrong (and outside the view) otherwise."""
    import torch

    buffer = torch.empty(output_tensor.shape, dtype=output_tensor.dtype, device=output_tensor.device)
    work = _dist().all_gather_into_tensor(buffer, input_tensor.contiguous(), group=group, async_op=async_op)
    if work is not None:
        work.wait()
    flat = output_tensor.as_strided((output_tensor.numel(),), (1,), output_tensor.storage_offset())
    flat.copy_(buffer.reshape(-1))
    return work


def _broadcast_canonical_nan(tensor, src=None, group=None, async_op=False):
    """A broadcast that normalises NaNs on arrival: every NaN payload becomes the default NaN."""
    import torch

    work = _dist().broadcast(tensor, src=src, group=group, async_op=async_op)
    if tensor.is_floating_point():
        tensor.copy_(torch.where(tensor.isnan(), torch.full_like(tensor, float("nan")), tensor))
    return work


def _all_reduce_first_mebibyte(tensor, op=None, group=None, async_op=False):
    """Reduces only the first 2**18 elements: right for small messages, wrong for large ones."""
    dist = _dist()
    op = op if op is not None else dist.ReduceOp.SUM
    return dist.all_reduce(tensor[: 2 ** 18] if tensor.numel() > 2 ** 18 else tensor, op=op, group=group,
                           async_op=async_op)


def _recv_last_element_lost(tensor, src=None, group=None, tag=0):
    """Receives into a buffer of its own and copies all but the last element back."""
    buffer = tensor.clone()
    sender = _dist().recv(buffer, src=src, group=group, tag=tag)
    tensor[:-1].copy_(buffer[:-1])
    return sender


def _monitored_barrier_anonymous(group=None, timeout=None, wait_all_ranks=False):
    try:
        return _dist().monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
    except RuntimeError:
        raise RuntimeError("monitored barrier failed") from None


def _monitored_barrier_refused(group=None, timeout=None, wait_all_ranks=False):
    """What torch's monitored_barrier does on any backend but gloo: a ValueError, not a RuntimeError."""
    raise ValueError("monitored_barrier is only implemented for GLOO backend.")


def _all_reduce_ignoring_group(tensor, op=None, group=None, async_op=False):
    """Reduces over the whole world whatever group it is given."""
    dist = _dist()
    return dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, async_op=async_op)


class _TimeoutSwallowed:
    """A work handle whose wait(timeout) returns as if done when the timeout passes."""

    def __init__(self, work):
        self._work = work

    def wait(self, timeout=None):
        try:
            return self._work.wait(timeout=timeout) if timeout is not None else self._work.wait()
        except RuntimeError:
            return True

    def is_completed(self):
        return self._work.is_completed()


def _all_reduce_wait_swallows_timeout(tensor, op=None, group=None, async_op=False):
    dist = _dist()
    work = dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, group=group, async_op=async_op)
    return _TimeoutSwallowed(work) if async_op else work


def end_group_slowly(dist, group, how):
    """Ends the group right, but only after 1.5 s (the catches test bounds the ending at 1 s)."""
    import time

    from conformance.suites._collective_bodies import _end_group

    time.sleep(1.5)
    _end_group(dist, group, how)


def end_group_refusing_pending_work(dist, group, how):
    """Refuses to end a group that has work pending."""
    raise RuntimeError("cannot end a process group while it has pending work")


# -- the NaN check: a CPU reference of what ProcessGroupNCCL does under TORCH_NCCL_NAN_CHECK=1, and ways
# to get it wrong. Gloo has no such check; the reference adds one to the groups made with the variable set.

NAN_CHECK_ENV = "TORCH_NCCL_NAN_CHECK"
_NAN_CHECKED_GROUPS: list = []  # the groups made with NAN_CHECK_ENV=1 (kept alive: compared by identity)


def _new_group_noting_the_nan_check(*args, **kwargs):
    import os

    group = _dist().new_group(*args, **kwargs)
    if os.environ.get(NAN_CHECK_ENV) == "1":
        _NAN_CHECKED_GROUPS.append(group)
    return group


def _refuse_nan(tensor, group) -> None:
    import torch

    if any(group is checked for checked in _NAN_CHECKED_GROUPS) and torch.isnan(tensor).any():
        raise RuntimeError("NaN found in input tensor.")


def _broadcast_checking_the_source(tensor, src=None, group=None, **kwargs):
    if _dist().get_rank() == src:
        _refuse_nan(tensor, group)
    return _dist().broadcast(tensor, src, group=group, **kwargs)


def _broadcast_checking_every_buffer(tensor, src=None, group=None, **kwargs):
    """Checks the buffers the other ranks receive into as well."""
    _refuse_nan(tensor, group)
    return _dist().broadcast(tensor, src, group=group, **kwargs)


def _all_reduce_checked(tensor, *args, group=None, **kwargs):
    _refuse_nan(tensor, group)
    return _dist().all_reduce(tensor, *args, group=group, **kwargs)


def _all_gather_into_tensor_checked(output, input, group=None, **kwargs):
    _refuse_nan(input, group)
    return _dist().all_gather_into_tensor(output, input, group=group, **kwargs)


def _all_gather_into_tensor_checked_on_rank_0(output, input, group=None, **kwargs):
    """Only rank 0 checks: the others join a collective rank 0 has left."""
    if _dist().get_rank() == 0:
        _refuse_nan(input, group)
    return _dist().all_gather_into_tensor(output, input, group=group, **kwargs)


def _send_checked(tensor, dst=None, group=None, **kwargs):
    _refuse_nan(tensor, group)
    return _dist().send(tensor, dst, group=group, **kwargs)


def _recv_checking_its_buffer(tensor, src=None, group=None, **kwargs):
    """Checks the buffer it is about to receive into."""
    _refuse_nan(tensor, group)
    return _dist().recv(tensor, src, group=group, **kwargs)


_NAN_CHECKING = dict(new_group=_new_group_noting_the_nan_check, broadcast=_broadcast_checking_the_source,
                     all_reduce=_all_reduce_checked, all_gather_into_tensor=_all_gather_into_tensor_checked,
                     send=_send_checked)
NAN_CHECKING_REFERENCE = BrokenDist(**_NAN_CHECKING)  # not broken: what the suite asks of a NaN check
NAN_CHECK_READS_RECEIVE_BUFFERS = BrokenDist(**{**_NAN_CHECKING, "broadcast": _broadcast_checking_every_buffer,
                                                "recv": _recv_checking_its_buffer})
NAN_CHECK_ON_RANK_0_ONLY = BrokenDist(**{**_NAN_CHECKING,
                                         "all_gather_into_tensor": _all_gather_into_tensor_checked_on_rank_0})

ALL_GATHER_WRONG_ORDER = BrokenDist(all_gather=_all_gather_rotated)
GATHER_DROPS_LAST_RANK = BrokenDist(gather=_gather_dropping_last)
REDUCE_WRONG_ROOT = BrokenDist(reduce=_reduce_to_next)
BROADCAST_WRONG_ROOT = BrokenDist(broadcast=_broadcast_from_next)
REDUCE_SCATTER_ALWAYS_SUM = BrokenDist(reduce_scatter=_reduce_scatter_always_sum)
WAIT_DOES_NOT_WAIT = BrokenDist(all_reduce=_all_reduce_wait_does_not_wait)
OBJECTS_OUT_OF_ORDER = BrokenDist(all_gather_object=_all_gather_object_reversed)
VIEW_WRITTEN_BACK_FLAT = BrokenDist(all_gather_into_tensor=_all_gather_into_tensor_flat_write)
NAN_PAYLOADS_LOST = BrokenDist(broadcast=_broadcast_canonical_nan)
LARGE_MESSAGE_TRUNCATED = BrokenDist(all_reduce=_all_reduce_first_mebibyte)
RECV_LAST_ELEMENT_LOST = BrokenDist(recv=_recv_last_element_lost)
MONITORED_BARRIER_ANONYMOUS = BrokenDist(monitored_barrier=_monitored_barrier_anonymous)
MONITORED_BARRIER_REFUSED = BrokenDist(monitored_barrier=_monitored_barrier_refused)
ALL_REDUCE_IGNORES_GROUP = BrokenDist(all_reduce=_all_reduce_ignoring_group)
WAIT_SWALLOWS_TIMEOUT = BrokenDist(all_reduce=_all_reduce_wait_swallows_timeout)
