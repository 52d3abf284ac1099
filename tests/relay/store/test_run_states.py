"""The run state machine (relay.store.run_states): every transition of the table, and every refusal with its code."""

import datetime as dt
import itertools

import pytest

from relay.store.run_states import (
    FINAL_STATES, TRANSITIONS, RunState, TransitionRefused, check_transition, execution_seconds, queue_seconds,
    state_for_conclusion,
)

S = RunState
ALLOWED = {
    (S.dispatched, S.in_progress), (S.dispatched, S.timed_out), (S.dispatched, S.cancelled),
    (S.in_progress, S.completed), (S.in_progress, S.timed_out), (S.in_progress, S.cancelled),
}


def test_the_table_is_exactly_the_documented_life():
    assert {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts} == ALLOWED
    assert FINAL_STATES == {S.completed, S.timed_out, S.cancelled}


@pytest.mark.parametrize("current,target", sorted(ALLOWED))
def test_allowed_transitions_pass(current, target):
    check_transition(current, target, run="cuda run 1 attempt 1")


EXPECTED_CODES = {
    (S.dispatched, S.completed): "completed_before_in_progress",
    (S.dispatched, S.dispatched): "completed_before_in_progress",
    (S.in_progress, S.in_progress): "replay",
    (S.in_progress, S.dispatched): "invalid_transition",
    (S.completed, S.completed): "already_completed",
    (S.completed, S.cancelled): "already_completed",
    (S.completed, S.timed_out): "already_completed",
    (S.completed, S.in_progress): "already_completed",
}


@pytest.mark.parametrize("current,target", [p for p in itertools.product(S, S) if p not in ALLOWED])
def test_every_other_transition_is_refused_with_a_code_and_the_run_named(current, target):
    with pytest.raises(TransitionRefused) as info:
        check_transition(current, target, run="cuda run 42 attempt 2")
    assert "cuda run 42 attempt 2" in info.value.message
    expected = EXPECTED_CODES.get((current, target))
    if expected is None and current in FINAL_STATES:
        expected = f"already_{current.value}"
    if current is S.completed and target is not S.dispatched:
        expected = EXPECTED_CODES.get((current, target), "already_completed")
    assert info.value.code == (expected or "invalid_transition")


def test_completed_before_in_progress_message_says_what_to_do():
    with pytest.raises(TransitionRefused, match="before in_progress; call back with state in_progress"):
        check_transition(S.dispatched, S.completed, run="x")


def test_conclusions_map_to_final_states():
    assert state_for_conclusion("success") is S.completed
    assert state_for_conclusion("failure") is S.completed
    assert state_for_conclusion("cancelled") is S.cancelled
    assert state_for_conclusion("timed_out") is S.timed_out


def test_queue_and_execution_time():
    t0 = dt.datetime(2024, 1, 1, 10, 0)
    assert queue_seconds(t0, None) is None
    assert queue_seconds(t0, t0 + dt.timedelta(seconds=90)) == 90
    assert execution_seconds(t0, t0 + dt.timedelta(minutes=5)) == 300
    assert execution_seconds(None, t0) is None
