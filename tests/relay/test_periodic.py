"""The relay's background thread (relay.periodic.PeriodicThread) stops when told, whatever it was doing."""

from __future__ import annotations

import threading

from relay.periodic import PeriodicThread

HOUR = 3600.0


def _running(name: str) -> bool:
    return any(thread.name == name for thread in threading.enumerate())


def test_a_stop_that_comes_while_a_pass_pauses_ends_the_thread_instead_of_waiting_out_its_next_wait():
    # The dispatcher pauses at the start of a pass (its gap between empty claims); a pause spends the
    # wakes that came meanwhile, and stop() is one. Before the fix the thread then waited its whole
    # next wait (the poll: 30 s in a test, minutes in a deployment) before it saw the stop.
    pausing = threading.Event()
    thread: PeriodicThread

    def one_pass():
        pausing.set()
        thread.pause(HOUR)  # stop() ends a pause at once

    thread = PeriodicThread("pauses-in-its-pass", HOUR, one_pass, next_wait=lambda: HOUR)
    thread.start()
    assert pausing.wait(10)
    thread.stop(timeout=10)
    assert not _running("pauses-in-its-pass"), "the thread outlived stop(): it missed the stop and waits its hour"


def test_a_stop_while_the_thread_waits_for_its_next_pass_ends_it():
    passes = threading.Semaphore(0)
    thread = PeriodicThread("waits-an-hour", HOUR, passes.release, next_wait=lambda: HOUR)
    thread.start()
    assert passes.acquire(timeout=10)  # the first pass ran; now it waits an hour
    thread.stop(timeout=10)
    assert not _running("waits-an-hour")
