"""Level holds: a backend at a blocking level that falls below its hold bar is reported non-blocking
(neutral, with the reason and a link to its review) until a person restores it or it is back above
its bar for the configured time; every hold is stored and shown. Real store, fake GitHub over HTTP."""

from __future__ import annotations

from relay.trust import BackendTarget, TrustLevel


def test_a_hold_is_stored_with_its_reason_start_and_end(store):
    store.sync_backends([BackendTarget("l4", "org/l4-ci", TrustLevel.L4, "ciflow/crcr/l4")])
    assert store.current_level_hold("l4") is None
    hold = store.start_level_hold("l4", "L4", "success rate 40% misses the L4 bar")
    assert (hold.backend, hold.level, hold.active, hold.above_since) == ("l4", "L4", True, None)
    again = store.start_level_hold("l4", "L4", "another reason")  # one active hold per backend
    assert (again.id, again.reason) == (hold.id, "success rate 40% misses the L4 bar")
    above = store.mark_level_hold_above_bar("l4")
    assert above.above_since is not None
    assert store.mark_level_hold_above_bar("l4").above_since == above.above_since  # from the first pass above
    assert store.start_level_hold("l4", "L4", "below again").above_since is None  # below again: the clock restarts
    ended = store.end_level_hold("l4", "restored: flaky runner replaced")
    assert (ended.id, ended.active, ended.ended_by, ended.ended_by_person) == (
        hold.id, False, "restored: flaky runner replaced", True)
    assert store.current_level_hold("l4") is None and store.end_level_hold("l4", "x") is None
    second = store.start_level_hold("l4", "L4", "time-out rate 5% misses the L4 bar")
    assert second.id != hold.id
    assert [h.id for h in store.level_holds("l4")] == [second.id, hold.id]  # newest first
    assert store.current_level_hold("l4") == second
