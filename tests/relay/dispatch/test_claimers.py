"""Claimer ids name a process so that another on the same machine can tell it is dead: a process that
exited, or a pid now held by a later process, is known dead; a live one, one of another machine or PID
namespace, or an id of another shape is not (its claims wait for their lease)."""

from __future__ import annotations

import os
import subprocess
import sys

from relay.dispatch.claimers import known_dead, own_claimer


def test_an_exited_process_is_known_dead_and_a_live_one_is_not():
    child = subprocess.run([sys.executable, "-c", "from relay.dispatch.claimers import own_claimer; print(own_claimer())"],
                           capture_output=True, text=True, check=True)
    exited = child.stdout.strip()
    scope, pid, start, _ = exited.split(".")
    assert int(pid) != os.getpid() and len(exited) < 64  # claimed_by is String(64)
    assert known_dead(exited)
    mine = own_claimer()
    assert not known_dead(mine) and mine != own_claimer()  # unique per call
    my_scope, my_pid, my_start, _ = mine.split(".")
    assert my_scope == scope  # one boot, one PID namespace
    assert known_dead(f"{my_scope}.{my_pid}.{int(my_start) + 1}.abcdef12")  # this pid, but a later process


def test_claims_of_another_machine_or_shape_are_never_known_dead():
    scope, pid, start, _ = own_claimer().split(".")
    assert not known_dead(f"{'0' * 12}.{pid}.{start}.abcdef12")  # another boot or PID namespace
    assert not known_dead(f"{'0' * 12}.999999999.1.abcdef12")
    assert not known_dead("3f2a9c4e1b7d")  # an id from before claimers were checkable
    assert not known_dead(f"{scope}.x.{start}.abcdef12")
