"""The collectives suites catch what they claim: each broken stand-in for torch.distributed below
fails the check that covers it, with a message naming the collective, the rank and what differs,
while the real implementation passes the same check.

The broken implementations live in ``tests.conformance.suites._broken_dist``; the suites' rank functions import
them on every rank by name, over the same real process group the suites use.
"""

from __future__ import annotations

import pytest

from conformance.checks import ConformanceFailure
from conformance.suites import test_collective_layouts as layouts
from conformance.suites import test_collectives as collectives
from conformance.suites import test_p2p as p2p
from conformance.suites import test_process_groups as groups

BROKEN = "tests.conformance.suites._broken_dist:"


def _caught(check, *args, broken: str, match: str):
    """``check`` passes with the real collectives and fails with ``broken``, saying ``match``."""
    check(*args)
    with pytest.raises(ConformanceFailure, match=match):
        check(*args, impl=BROKEN + broken)


def test_all_gather_in_the_wrong_rank_order(ranks):
    _caught(collectives.check_all_gather, ranks, "float32", broken="ALL_GATHER_WRONG_ORDER",
            match=r"all_gather into a tensor list on float32 over gloo is wrong:\n  rank 0: \d+ of \d+ elements "
                  r"differ bitwise, first at flat index 0")


def test_gather_that_drops_the_last_rank(ranks):
    _caught(collectives.check_gather, ranks, "int64", broken="GATHER_DROPS_LAST_RANK",
            match=r"gather to dst 0 on int64 over gloo \(rank 0 = dst\) is wrong:\n  rank 0: \d+ of \d+ elements "
                  r"differ bitwise, first at flat index 37")


def test_reduce_to_the_wrong_root(ranks):
    _caught(collectives.check_reduce, ranks, "SUM", "int32", broken="REDUCE_WRONG_ROOT",
            match=r"rank 0: reduce\(SUM\) on int32 to dst 0 over gloo \(rank numbers: 0 = dst\) is wrong: "
                  r"\d+ of 33 elements differ")


def test_broadcast_from_the_wrong_root(ranks):
    _caught(collectives.check_broadcast, ranks, "float16", broken="BROADCAST_WRONG_ROOT",
            match=r"broadcast from src 0 on float16 over gloo is wrong:\n  rank 0: \d+ of 37 elements differ bitwise")


def test_reduce_scatter_that_ignores_the_op(ranks):
    _caught(collectives.check_reduce_scatter, ranks, "MAX", "int64", broken="REDUCE_SCATTER_ALWAYS_SUM",
            match=r"rank 0: reduce_scatter \(list\)\(MAX\) on int64 over gloo is wrong: \d+ of 3 elements differ")
    collectives.check_reduce_scatter(ranks, "SUM", "int64", impl=BROKEN + "REDUCE_SCATTER_ALWAYS_SUM")


def test_a_wait_that_does_not_wait(ranks):
    _caught(collectives.check_async, ranks, "all_reduce", broken="WAIT_DOES_NOT_WAIT",
            match=r"all_reduce\(async_op=True\) over gloo is wrong:\n  rank 0: right after wait\(\) returned, "
                  r"output 0 is not in place: \d+ of 4 elements differ bitwise")
    collectives.check_all_reduce(ranks, "SUM", "float32", impl=BROKEN + "WAIT_DOES_NOT_WAIT")  # blocking form is fine


def test_an_object_list_out_of_order(ranks):
    _caught(collectives.check_object_collectives, ranks, broken="OBJECTS_OUT_OF_ORDER",
            match=r"object collectives over gloo is wrong:\n  rank 0: all_gather_object: got \[\{'rank': 1, ")


def test_nan_payloads_lost_in_transit(ranks):
    _caught(collectives.check_broadcast, ranks, "float32", broken="NAN_PAYLOADS_LOST",
            match=r"broadcast from src 0 on float32 over gloo is wrong:\n  rank 0: \d+ of 37 elements differ "
                  r"bitwise, first at flat index \d+: got bytes 0000c07f \(nan\), expected ")
    collectives.check_broadcast(ranks, "int8", impl=BROKEN + "NAN_PAYLOADS_LOST")  # integers have no NaN


def test_a_view_written_back_as_if_contiguous(ranks):
    _caught(layouts.check_layout, ranks, "all_gather_into_tensor", "transposed", broken="VIEW_WRITTEN_BACK_FLAT",
            match=r"all_gather_into_tensor on a transposed view over gloo is wrong:\n  rank 0: output view 0: \d+ of "
                  r"\d+ elements differ bitwise.*\n  rank 0: around output view 0: \d+ elements outside the view "
                  r"were overwritten")
    layouts.check_layout(ranks, "all_gather_into_tensor", "offset", impl=BROKEN + "VIEW_WRITTEN_BACK_FLAT")


def test_a_large_message_cut_short(ranks):
    with pytest.raises(ConformanceFailure, match=r"collectives on 1048579 float32 elements over gloo is wrong:\n"
                                                 r"  rank 0: all_reduce: \d+ of 1048579 elements differ bitwise, "
                                                 r"first at flat index 262144"):
        layouts.check_large_message(ranks, impl=BROKEN + "LARGE_MESSAGE_TRUNCATED")
    collectives.check_all_reduce(ranks, "SUM", "float32", impl=BROKEN + "LARGE_MESSAGE_TRUNCATED")


def test_a_recv_that_loses_the_last_element(ranks):
    _caught(p2p.check_send_recv, ranks, "int32", broken="RECV_LAST_ELEMENT_LOST",
            match=r"send/recv on int32 over gloo is wrong:\n  send from rank 0 to rank 1: 1 of 29 elements differ "
                  r"bitwise, first at flat index 28")


def test_a_monitored_barrier_that_does_not_name_the_missing_rank(ranks):
    _caught(groups.check_missing_rank, ranks, "monitored_barrier", broken="MONITORED_BARRIER_ANONYMOUS",
            match=r"a monitored_barrier the last rank skips over gloo is wrong:\n  rank 0: the error does not name "
                  r"the missing rank 1: RuntimeError: monitored barrier failed")


def test_a_monitored_barrier_refused_with_a_value_error_is_recorded_not_raised(ranks):
    """torch refuses monitored_barrier off gloo with a ValueError: the check reports it as the rank's
    error (a known failure on those backends), rather than the body raising past its handler."""
    _caught(groups.check_missing_rank, ranks, "monitored_barrier", broken="MONITORED_BARRIER_REFUSED",
            match=r"a monitored_barrier the last rank skips over gloo is wrong:\n  rank 0: the error does not name "
                  r"the missing rank 1: ValueError: monitored_barrier is only implemented for GLOO backend\.")


def test_an_all_reduce_that_ignores_its_subgroup(ranks):
    _caught(groups.check_subgroup, ranks, "new_subgroups", broken="ALL_REDUCE_IGNORES_GROUP",
            match=r"collectives on a new_subgroups over gloo is wrong:\n  rank 0: all_reduce on its new_subgroups of "
                  r"ranks \[0\]: \d+ of 5 elements differ bitwise")


def test_an_unknown_implementation_is_a_clear_error(ranks):
    from conformance import RankError

    with pytest.raises(RankError, match=r"expected 'torch' or 'package.module:ATTRIBUTE'"):
        collectives.check_all_reduce(ranks, "SUM", "float32", impl="no-such-thing")


def test_a_wait_that_returns_when_its_timeout_passes(ranks):
    _caught(groups.check_pending_work, ranks, "abort", broken="WAIT_SWALLOWS_TIMEOUT",
            match=r"group.abort\(\) with work pending that rank 1 never joins over gloo is wrong:\n  rank 0: "
                  r"work.wait\(timeout=2 s\) returned although rank 1 never joined the all_reduce")


def test_an_ending_that_refuses_or_outlasts_pending_work(ranks):
    groups.check_pending_work(ranks, "shutdown", end_limit=1.0)
    with pytest.raises(ConformanceFailure, match=r"group.shutdown\(\) with work pending that rank 1 never joins over "
                                                 r"gloo is wrong:\n  rank 0: group.shutdown\(\) with an all_reduce "
                                                 r"pending raised RuntimeError: cannot end a process group while it "
                                                 r"has pending work"):
        groups.check_pending_work(ranks, "shutdown", ender=BROKEN + "end_group_refusing_pending_work")
    with pytest.raises(ConformanceFailure, match=r"rank 0: destroy_process_group\(group\) with an all_reduce pending "
                                                 r"took 1\.\d s \(bound 1 s\)"):
        groups.check_pending_work(ranks, "destroy", ender=BROKEN + "end_group_slowly", end_limit=1.0)


def test_a_nan_check_that_misses_a_nan_reads_receive_buffers_or_checks_one_rank(ranks):
    """Against the CPU reference of NCCL's check (gloo has none): gloo itself, as a backend declaring the
    check, lets the NaN through on every rank; a check of receive buffers fails legitimate code; a check on
    rank 0 only leaves rank 1 waiting in the collective."""
    from tests.conformance.suites._broken_dist import NAN_CHECK_ENV

    reference = BROKEN + "NAN_CHECKING_REFERENCE"
    for case in ("clean", "receive_buffer", "input"):
        groups.check_nan_check(ranks, case, impl=reference, nan_check=NAN_CHECK_ENV)
    on = f"on a group made with {NAN_CHECK_ENV}=1"
    declared = f"although cpu declares semantics.nan_check: {NAN_CHECK_ENV}"
    with pytest.raises(ConformanceFailure, match=rf"an all_gather_into_tensor with a NaN in every rank's input, {on}, "
                                                 rf"over gloo is wrong:\n  rank 0: did not fail \(it completed, or "
                                                 rf"waited for its peers\) {declared}\n  rank 1: did not fail"):
        groups.check_nan_check(ranks, "input", nan_check=NAN_CHECK_ENV)
    with pytest.raises(ConformanceFailure, match=rf"a broadcast and a recv into buffers holding a NaN, {on}, over gloo "
                                                 rf"is wrong:\n  rank 1: raised RuntimeError: NaN found in input tensor. "
                                                 rf"\(a NaN check reads only what a rank sends\)"):
        groups.check_nan_check(ranks, "receive_buffer", impl=BROKEN + "NAN_CHECK_READS_RECEIVE_BUFFERS",
                               nan_check=NAN_CHECK_ENV)
    with pytest.raises(ConformanceFailure, match=r"over gloo is wrong:\n  rank 1: did not fail \(it completed, or "
                                                 rf"waited for its peers\) {declared}$"):
        groups.check_nan_check(ranks, "input", impl=BROKEN + "NAN_CHECK_ON_RANK_0_ONLY", nan_check=NAN_CHECK_ENV)
