"""The accelerator descriptors (cuda, rocm, xpu) cannot be run here, so their known failures are checked
against the suites' real test ids: every pattern names at least one test, and none of them swallows a
test that expects the backend to refuse (those pass on a backend that refuses)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from conformance.descriptors import load_descriptors
from tests import forked_commands

ACCELERATORS = ("cuda", "rocm", "xpu")


@pytest.fixture(scope="module")
def test_ids():
    exe = shutil.which("conformance")
    cmd = [exe] if exe else [sys.executable, "-m", "conformance.cli"]
    result = forked_commands.run(cmd + ["list", "--backend", "cpu"], cwd=os.getcwd(), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = [line.split()[0] for line in result.stdout.splitlines() if "::" in line]
    # The listing ends with its count: a listing cut short must fail here, not as patterns matching no test.
    assert result.stdout.splitlines()[-1] == f"{len(listed)} tests", result.stdout[-2000:] + result.stderr[-2000:]
    return listed


@pytest.mark.parametrize("name", ACCELERATORS)
def test_every_known_failure_names_a_real_test(test_ids, name):
    descriptor = load_descriptors()[name]
    dead = [kf.match for kf in descriptor.known_failures if not any(kf.matches(t) for t in test_ids)]
    assert not dead, f"{name}.yaml: patterns matching no test: {dead}"


@pytest.mark.parametrize("name", ACCELERATORS)
def test_refusal_tests_are_not_listed_as_failures(test_ids, name):
    descriptor = load_descriptors()[name]
    refusals = [t for t in test_ids if "rejects_undefined" in t]
    assert refusals
    assert [t for t in refusals if descriptor.known_failure_for(t)] == []


@pytest.mark.parametrize("name, refused", [("cuda", "Cannot use ReduceOp.BAND/BOR/BXOR with NCCL"),
                                           ("rocm", "Cannot use ReduceOp.BAND/BOR/BXOR with NCCL"),
                                           ("xpu", "with XCCL")])
def test_bitwise_reductions_are_known_failures_with_the_backends_words(test_ids, name, refused):
    descriptor = load_descriptors()[name]
    bitwise = [t for t in test_ids if t.startswith(("collectives::test_all_reduce[B", "collectives::test_reduce[B"))]
    assert len(bitwise) >= 15
    for test_id in bitwise:
        known = descriptor.known_failure_for(test_id)
        assert known is not None and refused in known.reason and known.link.startswith("https://"), test_id


def test_device_independent_failures_are_marked_and_shared():
    descriptors = load_descriptors()
    cpu = {(kf.match, kf.link) for kf in descriptors["cpu"].known_failures}
    for name in ACCELERATORS:
        copied = [kf for kf in descriptors[name].known_failures if (kf.match, kf.link) in cpu]
        assert copied, name
        unmarked = [kf.match for kf in copied if "device-independent" not in kf.reason]
        assert not unmarked, f"{name}.yaml copies cpu entries without saying they are device-independent: {unmarked}"
