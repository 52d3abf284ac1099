"""The ``p2p_ordering`` suite catches what it claims: each broken ``batch_isend_irecv`` of
``tests.conformance.suites._broken_p2p`` fails the check that covers it, with a message naming the backend, the
rank and the operation, while the real one passes the same check."""

from __future__ import annotations

import pytest

from conformance.suites import test_p2p_ordering as ordering
from tests.conformance.suites._caught import caught

BROKEN = "tests.conformance.suites._broken_p2p:"

pytestmark = pytest.mark.world_size(2)  # the messages asserted name the ranks of a 2-rank run


@pytest.mark.parametrize("batches", [1, 3])
def test_two_messages_to_one_peer_posted_in_the_wrong_order(ranks, batches):
    caught(ordering.check_batches_in_order, ranks, batches, impl=BROKEN + "BATCH_SAME_PEER_SWAPPED",
           match=rf"6 messages per pair and direction in {batches} batch_isend_irecv call\(s\) over gloo is wrong:\n"
                 r"  rank 0: batch 0, message 0 of 6 from rank 1 \(to next of it, 29 x float32\): \d+ of 29 elements "
                 r"differ bitwise")


def test_tags_ignored_by_a_backend_that_promises_them(ranks):
    caught(ordering.check_tags_against_order, ranks, impl=BROKEN + "BATCH_TAGS_DROPPED",
           match=r"batch_isend_irecv with tags posted against sending order over gloo \(descriptor cpu: p2p_matching "
                 r"tag\) is wrong:\n  rank 0: the first receive posted \(tag 2\) from rank 1 should hold message "
                 r"B \(tag 2\): \d+ of 16 elements differ bitwise")


def test_a_batch_that_skips_what_is_not_a_p2p_op(ranks):
    caught(ordering.check_batch_refusals, ranks, impl=BROKEN + "BATCH_SKIPS_NON_P2P_OPS",
           match=r"batch_isend_irecv refusals over gloo is wrong:\n  rank 0: batch_isend_irecv with a list holding a "
                 r"tensor, not a P2POp went through instead of raising ValueError")
