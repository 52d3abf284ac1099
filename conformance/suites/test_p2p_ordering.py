"""P2P ordering: several messages between one pair of ranks, in one ``batch_isend_irecv`` and across
batches posted before any is waited, of mixed sizes and dtypes, in both directions; how tags and posting
order decide which receive gets which message (the descriptor's ``p2p_matching``: ``tag`` for gloo,
``order`` for NCCL, which ignores tags); and the calls ``batch_isend_irecv`` must refuse.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires
from conformance.suites import _collective_data as data
from conformance.suites import _p2p_order_bodies as bodies
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]  # a message needs a peer

CALL_LIMIT = 60.0  # seconds: refusals raise at once; a call that sends instead may never finish


def check_batches_in_order(ranks, batches: int, impl="torch"):
    salt, world = f"p2p_order/{batches}", ranks.world_size
    results = data.run_packed(ranks, bodies.batches_in_order_on_rank, salt, batches, impl=impl)
    problems = []
    for rank, received in enumerate(results):
        if "error" in received:
            problems.append(f"rank {rank}: raised {received['error']}")
            continue
        for (batch, direction, index), got in sorted(received.items()):
            src = next(r for r in range(world) if bodies.peers(r, world)[direction] == rank)
            numel, dtype = bodies.MESSAGES[index]
            want = data.payload(bodies.message_salt(salt, batch, direction, index), src, numel, dtype)
            if (problem := data.same_bits(got, want)) is not None:
                problems.append(f"rank {rank}: batch {batch}, message {index} of {len(bodies.MESSAGES)} from rank "
                                f"{src} ({direction} of it, {numel} x {dtype}): {problem}")
    raise_problems(problems, f"{len(bodies.MESSAGES)} messages per pair and direction in "
                             f"{batches} batch_isend_irecv call(s) over {ranks.backend}")


@pytest.mark.parametrize("batches", [1, 3], ids=["one_batch", "three_batches"])
def test_messages_in_posting_order(ranks, batches):
    check_batches_in_order(ranks, batches)


def check_tags_against_order(ranks, impl="torch"):
    salt, world, matching = "p2p_order/tags", ranks.world_size, ranks.descriptor.p2p_matching
    results = data.run_packed(ranks, bodies.tags_against_order_on_rank, salt, impl=impl)
    problems = []
    for rank, received in enumerate(results):
        if "error" in received:
            problems.append(f"rank {rank}: raised {received['error']}")
            continue
        prev = (rank - 1) % world
        sent = {name: data.payload(f"{salt}/{name}", prev, bodies.TAGGED_NUMEL, "int64") for name in ("A", "B")}
        # By tag, the first receive (tag 2) gets B; by posting order (tags ignored) it gets A.
        want = {"first": sent["B"], "second": sent["A"]} if matching == "tag" else {"first": sent["A"], "second": sent["B"]}
        for which, posted in (("first", "tag 2"), ("second", "tag 1")):
            if (problem := data.same_bits(received[which], want[which])) is not None:
                expected = "B (tag 2)" if (which == "first") == (matching == "tag") else "A (tag 1)"
                problems.append(f"rank {rank}: the {which} receive posted ({posted}) from rank {prev} should hold "
                                f"message {expected}: {problem}")
    raise_problems(problems, f"batch_isend_irecv with tags posted against sending order over {ranks.backend} "
                             f"(descriptor {ranks.descriptor.name}: p2p_matching {matching})")


def test_tags_against_posting_order(ranks):
    check_tags_against_order(ranks)


def check_batch_refusals(ranks, impl="torch"):
    results = ranks.run_with_timeout(CALL_LIMIT, bodies.batch_refusals_on_rank, impl=impl)
    problems = []
    for rank, outcome in enumerate(results):
        for what, error_type, words in bodies.REFUSALS:
            got = outcome[what]
            if got is None:
                problems.append(f"rank {rank}: batch_isend_irecv with {what} went through instead of raising {error_type}")
            elif not got.startswith(f"{error_type}:") or words not in got:
                problems.append(f"rank {rank}: batch_isend_irecv with {what} raised {got}; expected {error_type} "
                                f"naming {words!r}")
    raise_problems(problems, f"batch_isend_irecv refusals over {ranks.backend}")


def test_batch_refusals(ranks):
    check_batch_refusals(ranks)
