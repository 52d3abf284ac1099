"""The controllers never touch a device: the device-touching probes (symmetric memory, bf16) run on a
rank, with the rank's settings, and the session reads rank 0's answers. The probes that only import
(DTensor, Dynamo) run there too when the selected tests' ranks import those modules anyway, so that a
controller does not import them for a yes; otherwise the controller probes them itself."""

from __future__ import annotations

import pytest
import yaml

from conformance.capabilities import probes_on_rank, rank_imports, rank_probed
from conformance.descriptors import packaged_backends_dir
from conformance.session import ConformanceSession, RunOptions


@pytest.fixture
def patched_backends(tmp_path):
    """The packaged cpu descriptor, with a setup module that changes torch in rank processes only."""
    descriptor = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    descriptor["setup_modules"] = ["tests.conformance.rank_only_patch"]
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(descriptor))
    return str(tmp_path)


def test_the_device_probes_run_on_a_rank_not_in_the_controller(patched_backends):
    session = ConformanceSession.create(RunOptions(backend="cpu", backends_dir=patched_backends))
    try:
        probe = session.capabilities.probes["symmetric_memory"]
        assert (probe.available, probe.reason) == (False, "probed on a rank, on device cpu")
        assert session.capabilities.probes["put_signal"].reason == "needs symmetric memory: probed on a rank, on device cpu"
        assert session.capabilities.probes["bf16"].available
        assert session.pools[2].started  # the default pool's ranks answered, as they start
    finally:
        session.close()


def test_rank_0_probes_what_its_ranks_import_anyway():
    assert rank_probed(()) == ()
    assert rank_probed(rank_imports(["dtensor"])) == ("dtensor", "parallelisms")
    assert rank_probed(rank_imports(["compile"])) == ("compile", "aot_compile")
    assert rank_probed(rank_imports(["collectives", "bf16"])) == ()


def test_a_rank_answers_the_probes_it_is_asked_and_leaves_one_that_raises_to_its_controller(monkeypatch):
    import torch

    from conformance import capabilities

    answers = probes_on_rank(torch.device("cpu"), "gloo", ["collectives", "dtensor"])
    assert answers["dtensor"] == (True, "") and answers["collectives"] == (True, "")
    assert answers["symmetric_memory"][0] is False and answers["bf16"] == (True, "")

    def broken(descriptor):
        raise RuntimeError("a probe that raises")

    monkeypatch.setattr(capabilities, "_probe_dtensor", broken)
    assert sorted(probes_on_rank(torch.device("cpu"), "gloo", ["dtensor"])) == ["bf16", "symmetric_memory"]


def test_the_import_probes_run_on_rank_0_when_its_ranks_import_dtensor_and_dynamo(patched_backends):
    session = ConformanceSession.create(RunOptions(backend="cpu", backends_dir=patched_backends))
    try:
        session.expect_rank_imports(rank_imports(["dtensor", "compile"]))  # as the plugin does after collection
        probes = session.capabilities.probes
        assert (probes["compile"].available, probes["compile"].reason) == \
            (False, "torch._dynamo is not supported on this Python")  # the rank's patched Dynamo answered
        assert probes["aot_compile"].reason == "needs compile: torch._dynamo is not supported on this Python"
        assert probes["dtensor"].available and probes["parallelisms"].available
        assert session.pools[2].rank_probes.keys() == {"symmetric_memory", "bf16", "dtensor", "compile",
                                                         "aot_compile", "parallelisms"}
    finally:
        session.close()


def test_ranks_started_before_the_tests_were_known_leave_the_import_probes_to_the_controller(patched_backends):
    session = ConformanceSession.create(RunOptions(backend="cpu", backends_dir=patched_backends))
    try:
        session.pool(2).start()  # as for a header printed up front, before collection
        session.expect_rank_imports(rank_imports(["compile"]))
        assert session.pools[2].rank_probes.keys() == {"symmetric_memory", "bf16"}
        assert session.capabilities.probes["compile"].available  # this process's own Dynamo answered
    finally:
        session.close()


def test_a_controller_imports_neither_dtensor_nor_dynamo_for_its_probes(pytester):
    pytester.makepyfile(test_imports='''
        import sys
        from conformance import requires

        def has(ctx, module):
            return module in sys.modules

        @requires("dtensor")
        @requires("compile")
        def test_dtensor_and_compile(ranks):
            assert ranks.run(has, "torch._dynamo") == [True, True]
            assert [m for m in ("torch._dynamo", "torch.distributed.tensor") if m in sys.modules] == []
    ''')
    # No --backend: the header then waits for collection, and the ranks start knowing what the tests import.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["capabilities: collectives=yes dtensor=yes compile=yes *"])
