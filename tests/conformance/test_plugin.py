"""Acceptance tests of the pytest plugin: real pytest runs (pytester) with real rank pools."""

from __future__ import annotations

import json
import re
import textwrap
import time
import uuid
from xml.etree import ElementTree

import pytest
import yaml

from conformance.descriptors import CAPABILITIES
from conformance.report import validate_report
from tests.conformance.tagged_processes import processes_tagged

SUITE = '''
import pytest
from conformance import requires, world_size

def on_rank(ctx, value):
    import torch, torch.distributed as dist
    t = torch.tensor([value + ctx.rank], device=ctx.device)
    dist.all_reduce(t)
    return int(t.item())

def test_sum(ranks):
    assert ranks.run(on_rank, 1) == [3, 3]
    assert (ranks.world_size, ranks.device, ranks.backend) == (2, "cpu", "gloo")

@requires("symmetric_memory")
def test_needs_symm(ranks):
    raise AssertionError("must not run on cpu")

@world_size(4)
def test_four(ranks):
    assert ranks.run(on_rank, 1) == [10, 10, 10, 10]  # skipped unless --max-ranks lets it have 4

def test_known_bug(ranks):
    assert ranks.run(on_rank, 1) == [0, 0]

def test_fixed_bug(ranks):
    assert ranks.run(on_rank, 1) == [3, 3]

def test_hang_skipped(ranks):
    raise AssertionError("skip mode must not run it")

def test_fails(ranks):
    assert ranks.run(on_rank, 1) == [4, 4], "wrong on purpose"
'''


def cpu_descriptor(**changes):
    data = {
        "name": "cpu", "device_type": "cpu", "detect": {"accelerator": "none"},
        "distributed_backend": "gloo", "world_size": 2,
        "capabilities": {c: c not in ("symmetric_memory", "put_signal") for c in CAPABILITIES},
        "known_failures": [
            {"match": "demo::test_known_bug", "reason": "sums are wrong here", "link": "https://example.org/1"},
            {"match": "demo::test_fixed_bug", "reason": "was wrong once", "link": "https://example.org/2"},
            {"match": "demo::test_hang*", "reason": "hangs the group", "link": "https://example.org/3",
             "mode": "skip"},
        ],
    }
    data.update(changes)
    return data


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_demo=SUITE)
    backends = pytester.mkdir("mybackends")
    (backends / "cpu.yaml").write_text(yaml.safe_dump(cpu_descriptor()))
    return backends


def outcomes(report):
    return {t["nodeid"].split("::")[-1]: t for t in report["tests"]}


def test_skip_xfail_and_report(pytester, suite):
    pytester.makeconftest("""
        import json
        def pytest_runtest_logreport(report):
            if report.when == "call" and report.longrepr is not None:
                with open("longreprs.json", "a") as f:
                    f.write(json.dumps([report.nodeid.rsplit("::", 1)[-1], str(report.longrepr)]) + "\\n")
    """)
    result = pytester.runpytest_subprocess("--backends-dir", str(suite), "--conformance-report", "report.json",
                                           "--junitxml", "junit.xml", "-rsxX", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, skipped=3, xfailed=1, xpassed=1)
    assert result.ret == 1  # test_fails; the unexpected pass alone would not fail the run
    out = result.stdout.str()
    # header
    assert "conformance: backend cpu" in out and "distributed backend gloo" in out and "world size 2" in out
    assert "symmetric_memory=no" in out and "collectives=yes" in out
    # skip reasons name what is missing and why
    assert "requires symmetric_memory: cpu declares symmetric_memory: false" in out
    assert "needs 4 ranks; cpu run has 2 (--max-ranks 4)" in out
    assert "known failure on cpu: hangs the group (https://example.org/3)" in out
    # a known failure that passes is an unexpected pass, shown but not a failure
    assert "XPASS test_demo.py::test_fixed_bug - known failure on cpu: was wrong once" in out

    report = json.loads((pytester.path / "report.json").read_text())
    validate_report(report)
    tests = outcomes(report)
    assert tests["test_sum"]["outcome"] == "passed"
    assert tests["test_sum"]["known_failure"] is None
    assert tests["test_known_bug"]["outcome"] == "xfailed"
    assert tests["test_known_bug"]["message"] == "known failure on cpu: sums are wrong here (https://example.org/1)"
    assert tests["test_known_bug"]["known_failure"] == {
        "match": "demo::test_known_bug", "reason": "sums are wrong here", "link": "https://example.org/1", "torch": None}
    assert tests["test_fixed_bug"]["outcome"] == "unexpected_pass"
    assert tests["test_fixed_bug"]["message"] == "passed: known failure on cpu: was wrong once (https://example.org/2)"
    assert tests["test_fixed_bug"]["known_failure"]["match"] == "demo::test_fixed_bug"
    assert tests["test_hang_skipped"]["known_failure"]["reason"] == "hangs the group"
    assert tests["test_fails"]["outcome"] == "failed"
    assert "wrong on purpose" in tests["test_fails"]["message"]
    assert tests["test_four"]["outcome"] == "skipped"
    assert {t["suite"] for t in tests.values()} == {"demo"}
    assert report["summary"] == {"passed": 1, "failed": 1, "skipped": 3, "xfailed": 1, "xpassed": 0,
                                 "errors": 0, "unexpected_passes": 1, "total": 7}
    assert report["backend"]["capabilities"]["symmetric_memory"] == {
        "declared": False, "probed": False, "reason": "SymmetricMemory does not support device type cpu"}
    # JUnit: the unexpected pass is a passing test case that says what it is and which entry it fixes
    junit = ElementTree.parse(pytester.path / "junit.xml").getroot()
    fixed = next(case for case in junit.iter("testcase") if case.get("name") == "test_fixed_bug")
    assert {p.get("name"): p.get("value") for p in fixed.iter("property")} == {
        "conformance.world_size": "2",
        "conformance.outcome": "unexpected_pass", "conformance.known_failure.match": "demo::test_fixed_bug",
        "conformance.known_failure.reason": "was wrong once", "conformance.known_failure.link": "https://example.org/2"}
    assert not list(fixed.iter("failure"))
    # The known failure's traceback, which nothing shows, is brief (the error, no statements or arguments,
    # which cost 8-12 ms a test to format); a failure's is pytest's whole traceback.
    longreprs = dict(json.loads(line) for line in (pytester.path / "longreprs.json").read_text().splitlines())
    assert longreprs["test_known_bug"].startswith("E   assert [3, 3] == [0, 0]\n")
    assert "ranks.run" not in longreprs["test_known_bug"]
    assert re.search(r"^    def test_fails\(ranks\):\n>\s+assert ranks.run\(on_rank, 1\) == \[4, 4\]",
                     longreprs["test_fails"], re.MULTILINE)
    failed = next(case for case in junit.iter("testcase") if case.get("name") == "test_fails")
    assert list(failed.iter("failure"))
    assert {p.get("name"): p.get("value") for p in failed.iter("property")} == {"conformance.world_size": "2"}


def test_with_max_ranks_a_test_that_needs_more_ranks_gets_a_pool_of_its_size(pytester, suite):
    pytester.makepyfile(test_bigger='''
        from conformance import world_size
        from test_demo import on_rank

        @world_size(4)
        def test_wrong_on_four(ranks):
            assert ranks.run(on_rank, 1) == [0, 0, 0, 0]
    ''')
    descriptor = cpu_descriptor()
    descriptor["known_failures"].append({"match": "bigger::test_wrong_on_four", "reason": "wrong from 4 ranks",
                                         "link": "https://example.org/4", "min_world_size": 4})
    (suite / "cpu.yaml").write_text(yaml.safe_dump(descriptor))
    args = ("--backends-dir", str(suite), "--conformance-report", "report.json", "-k", "four or sum", "-rxs",
            "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess(*args, "--max-ranks", "all")
    result.assert_outcomes(passed=2, xfailed=1)
    assert "world size 2 (tests that need more ranks get a pool of their size)" in result.stdout.str()
    tests = outcomes(json.loads((pytester.path / "report.json").read_text()))
    assert {name: (t["outcome"], t["world_size"]) for name, t in tests.items()} == {
        "test_sum": ("passed", 2), "test_four": ("passed", 4), "test_wrong_on_four": ("xfailed", 4)}
    # a 4-rank pool of its own, and the known failure judged by the pool's size, not the run's world size
    result = pytester.runpytest_subprocess(*args, "--max-ranks", "3")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*needs 4 ranks; cpu run has 3 (--max-ranks 4)*"])
    result = pytester.runpytest_subprocess(*args, "--max-ranks", "none")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--max-ranks: expected a positive integer or all, got 'none'" in result.stderr.str()


def test_strict_known_failures_make_an_unexpected_pass_fatal(pytester, suite):
    result = pytester.runpytest_subprocess("--backends-dir", str(suite), "--conformance-report", "report.json",
                                           "--strict-known-failures", "-k", "fixed_bug or sum", "-rfX",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    assert "[XPASS(strict)] known failure on cpu: was wrong once" in result.stdout.str()
    tests = outcomes(json.loads((pytester.path / "report.json").read_text()))
    # the report still says what happened: an unexpected pass (which the relay never counts as a failure)
    assert tests["test_fixed_bug"]["outcome"] == "unexpected_pass"
    assert tests["test_fixed_bug"]["message"] == "passed: known failure on cpu: was wrong once (https://example.org/2)"


def test_a_known_failure_bounded_to_other_torch_versions_does_not_apply(pytester):
    pytester.makepyfile(test_demo=SUITE)
    backends = pytester.mkdir("mybackends")
    entries = cpu_descriptor()["known_failures"]
    entries[0]["torch"] = "<2.13"  # fixed before every torch the suite supports: test_known_bug really fails
    entries[1]["torch"] = ">=2.13"
    (backends / "cpu.yaml").write_text(yaml.safe_dump(cpu_descriptor(known_failures=entries)))
    result = pytester.runpytest_subprocess("--backends-dir", str(backends), "--conformance-report", "report.json",
                                           "-k", "known_bug or fixed_bug", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, xpassed=1)
    assert "conformance: known failures: 2 of 3 entries apply to torch " in result.stdout.str()
    assert "(1 bounded to other versions)" in result.stdout.str()
    tests = outcomes(json.loads((pytester.path / "report.json").read_text()))
    assert tests["test_known_bug"]["outcome"] == "failed" and tests["test_known_bug"]["known_failure"] is None
    assert tests["test_fixed_bug"]["known_failure"]["torch"] == ">=2.13"


def test_report_duration_counts_setup_and_teardown(pytester):
    pytester.makepyfile(test_slow_fixture='''
        import time, pytest
        @pytest.fixture
        def slow():
            time.sleep(0.3)
            yield
            time.sleep(0.3)
        def test_quick_call(slow):
            pass
    ''')
    pytester.runpytest_subprocess("--conformance-report", "r.json", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    [test] = validate_report(json.loads((pytester.path / "r.json").read_text())).tests
    assert test.outcome == "passed" and test.duration >= 0.6


def test_world_size_four_runs_when_asked(pytester):
    pytester.makepyfile(test_four='''
        from conformance import world_size
        def who(ctx):
            return ctx.world_size
        @world_size(4)
        def test_four(ranks):
            assert ranks.run(who) == [4, 4, 4, 4]
        def test_default(ranks):
            assert ranks.run(who) == [4, 4, 4, 4]
        def test_asked_for_late(request):  # no hook saw it ask for ranks: it gets the run's world size
            assert request.getfixturevalue("ranks").run(who) == [4, 4, 4, 4]
    ''')
    pytester.runpytest_subprocess("--world-size", "4", "-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_the_ranks_are_forked_with_what_the_selected_and_declared_tests_need_imported(pytester):
    """The pools' fork server imports what the selected tests' declared capabilities need (capabilities.
    RANK_IMPORTS) before it forks the ranks (the server's side: test_start_methods.py): here DTensor and Dynamo
    for a DTensor test, and not Inductor for a compile test that skips because the descriptor declares no compile."""
    pytester.makepyfile(test_imports='''
        import sys
        from conformance import requires
        def has(ctx, module):
            return module in sys.modules
        @requires("compile")
        def test_compile(ranks):
            pass
        @requires("dtensor")
        def test_dtensor(ranks):
            assert ranks.pool.rank_imports == ("torch.distributed.tensor", "torch._dynamo")
            assert ranks.run(has, "torch.distributed.tensor") == [True, True]
    ''')
    backends = pytester.mkdir("b")
    caps = {c: c not in ("symmetric_memory", "put_signal", "compile", "aot_compile") for c in CAPABILITIES}
    (backends / "cpu.yaml").write_text(yaml.safe_dump(cpu_descriptor(capabilities=caps, known_failures=[])))
    # No --backend: the header then waits for collection, and the default pool starts after it.
    pytester.runpytest_subprocess("--backends-dir", str(backends), "-p", "no:cacheprovider").assert_outcomes(
        passed=1, skipped=1)


def test_mismatch_is_announced_and_tests_skip_with_the_probe_reason(pytester):
    pytester.makepyfile(test_symm='''
        from conformance import requires
        @requires("symmetric_memory")
        def test_symm(ranks):
            pass
    ''')
    backends = pytester.mkdir("b")
    caps = {c: True for c in CAPABILITIES}
    (backends / "cpu.yaml").write_text(yaml.safe_dump(cpu_descriptor(capabilities=caps, known_failures=[])))
    result = pytester.runpytest_subprocess("--backends-dir", str(backends), "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    out = result.stdout.str()
    assert "DECLARED/PROBED MISMATCH in cpu.yaml: symmetric_memory: declared true but the probe fails: " \
           "SymmetricMemory does not support device type cpu" in out
    assert "requires symmetric_memory: symmetric_memory unavailable on cpu: SymmetricMemory does not support " \
           "device type cpu" in out


def test_unknown_capability_in_marker_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
        from conformance import requires
        @requires("warp_drive")
        def test_x(ranks):
            pass
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "@requires('warp_drive'): unknown capability; allowed: collectives" in result.stderr.str()


@pytest.mark.parametrize("flag, value, expected", [
    ("--world-size", "0", "--world-size: expected a positive integer, got '0'"),
    ("--rank-timeout", "soon", "--rank-timeout: expected a positive number of seconds, got 'soon'"),
    ("--backend", "tpu", "unknown backend 'tpu'; known: cpu, cuda, rocm, xpu or auto"),
])
def test_bad_options_fail_at_the_command_line(pytester, flag, value, expected):
    pytester.makepyfile(test_x="def test_x(ranks):\n    pass\n")
    result = pytester.runpytest_subprocess(flag, value, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert expected in result.stderr.str()


@pytest.mark.fresh_interpreter  # a fork would have torch imported already
def test_unrelated_tests_do_not_wake_the_plugin(pytester):
    pytester.makepyfile(test_plain='''
        import sys
        def test_no_torch():
            assert "torch" not in sys.modules
    ''')
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_crash_fails_one_test_and_the_next_runs(pytester):
    pytester.makepyfile(test_crash='''
        import os
        def die(ctx):
            if ctx.rank == 1:
                os._exit(9)
            import time; time.sleep(30)
        def ok(ctx):
            return ctx.rank
        def test_a_crash(ranks):
            ranks.run(die)
        def test_b_after(ranks):
            assert ranks.run(ok) == [0, 1]
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "rank 1 died during die" in out and "exited with code 9" in out
    assert "pool respawned: rank 1 died during die" in out  # the run summary says what happened


def test_xdist_workers_have_their_own_pools_and_one_report(pytester):
    body = '''
        import os
        def pid(ctx):
            return os.getpid()
        def test_{n}(ranks):
            assert len(set(ranks.run(pid))) == 2
    '''
    for n in range(4):
        pytester.makepyfile(**{f"test_x{n}": textwrap.dedent(body.format(n=n))})
    pytester.makepyfile(test_needs_dtensor='''
        from conformance import requires
        @requires("dtensor")
        def test_dtensor(ranks):
            pass
    ''')
    result = pytester.runpytest_subprocess("-n", "2", "--conformance-report", "r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
    report = validate_report(json.loads((pytester.path / "r.json").read_text()))
    assert report.summary.passed == 5 and len(report.tests) == 5
    # Only a worker collected the test that needs DTensor, so only a worker probed it: the controller's
    # report and its closing summary still say what it found.
    assert report.backend.capabilities["dtensor"].probed is True
    assert "compile" not in report.backend.capabilities  # no selected test needed it
    result.stdout.fnmatch_lines(["capabilities: collectives=yes dtensor=yes compile=? *"])


def test_xdist_workers_events_reach_a_controller_that_printed_no_header(pytester):
    """A plain ``pytest -n 2`` (no --backend, no report): the controller collects nothing and holds no
    session, and what happened on its workers' ranks is still in its closing summary."""
    pytester.makepyfile(test_raises="""
        def boom(ctx):
            raise ValueError("boom")

        def test_raises(ranks):
            ranks.run(boom)
    """)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*= conformance =*", "gw?: 2 ranks: process group replaced after boom raised"])


def test_no_orphans_after_a_session_with_failures(pytester, monkeypatch):
    tag = uuid.uuid4().hex
    monkeypatch.setenv("CONFORMANCE_TEST_TAG", tag)
    pytester.makepyfile(test_mess='''
        import os, time
        def hang(ctx):
            time.sleep(60)
        def boom(ctx):
            raise RuntimeError("boom")
        def ok(ctx):
            return ctx.rank
        def test_hang(ranks):
            ranks.run_with_timeout(1, hang)
        def test_boom(ranks):
            ranks.run(boom)
        def test_ok_at_the_end(ranks):
            assert ranks.run(ok) == [0, 1]
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    deadline = time.monotonic() + 10
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_tagged(tag) == []
