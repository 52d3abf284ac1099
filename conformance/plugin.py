"""pytest plugin (``pytest11`` entry point ``conformance``): options, markers, the ``ranks`` fixture,
skip/xfail from descriptors, the session header and the JSON report.

Glue only: the backend and its pools live in ``conformance.session``, processes in
``conformance.ranks``. The plugin stays dormant (no torch import, no probing) until a session collects
a conformance test: one that uses ``ranks``, carries ``requires``/``world_size``, or is a packaged suite.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import types
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from conformance.capabilities import Probe, rank_imports
from conformance.descriptors import CAPABILITIES, DescriptorError
from conformance.items import (SUITES_DIR, required_capabilities, required_min_ranks, required_world_size,
                               suite_name, test_id_of)
from conformance.report import KnownFailureApplied, TestResult, write_report

SESSION_KEY = pytest.StashKey["ConformanceSession | None"]()
# Test reports carry what a known failure did as user properties: they cross pytest-xdist to the controller
# and appear in the JUnit file as <property> elements of the test case.
KNOWN_FAILURE_PROPERTY = "conformance.known_failure."  # + match, reason, link, torch
OUTCOME_PROPERTY = "conformance.outcome"
WORLD_SIZE_PROPERTY = "conformance.world_size"  # the ranks of the pool a test ran on
UNEXPECTED_PASS = "unexpected_pass"
RUN_PLUGIN = "conformance-run"  # the plugin manager's name for this config's ConformanceRun (hooks and the ranks fixture)


# Help text: one sentence, lower case, naming the default.
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "cross-backend conformance")
    group.addoption("--backend", default="auto",
                    help="backend descriptor to test: auto (detect, the default) or a descriptor name")
    group.addoption("--world-size", type=_parse_world_size, default=None,
                    help="ranks of the run's pool, where every test without @world_size runs "
                         "(default: the descriptor's)")
    group.addoption("--max-ranks", type=_parse_max_ranks, default=None, metavar="N|all",
                    help="most ranks a @world_size test may get, in a pool of its own: a number, or all (any on "
                         "cpu, the device count on an accelerator); default: the world size, one pool")
    group.addoption("--backends-dir", default=None,
                    help="extra descriptor directory overriding packaged ones (env CONFORMANCE_BACKENDS_DIR)")
    group.addoption("--rank-timeout", type=_parse_timeout, default=300.0,
                    help="seconds a ranks.run call may take before the pool is respawned (default 300)")
    group.addoption("--shared-dir", default=None, metavar="DIR",
                    help="a directory every rank sees, on a file system every node mounts (default: one per host)")
    group.addoption("--conformance-report", default=None, metavar="PATH",
                    help="write the JSON conformance report to PATH")
    group.addoption("--strict-known-failures", action="store_true", default=False,
                    help="fail the run when a known failure passes (default: report it as an unexpected pass)")


def _positive_int(value: str) -> int | None:
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 1 else None


def _parse_world_size(value: str) -> int:
    if (number := _positive_int(value)) is None:
        raise pytest.UsageError(f"--world-size: expected a positive integer, got {value!r}")
    return number


def _parse_max_ranks(value: str) -> int | str:
    if value == "all":
        return value
    if (number := _positive_int(value)) is None:
        raise pytest.UsageError(f"--max-ranks: expected a positive integer or all, got {value!r}")
    return number


def _parse_timeout(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if number <= 0:
        raise pytest.UsageError(f"--rank-timeout: expected a positive number of seconds, got {value!r}")
    return number


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the backend has them "
                            f"(one of: {', '.join(CAPABILITIES)})")
    config.addinivalue_line("markers", "world_size(n): run this test on a pool of exactly n ranks")
    config.addinivalue_line("markers", "min_ranks(n): skip unless the run has at least n ranks")
    config.addinivalue_line("markers", "shared_dir: the test's ranks exchange files through ctx.shared_dir "
                            "(skip when it is not one directory for every rank)")
    config.stash[SESSION_KEY] = None
    run = ConformanceRun(config)
    config.pluginmanager.register(run, RUN_PLUGIN)
    config.pluginmanager.register(_ranks_fixture_of(run), f"{RUN_PLUGIN}-ranks")
    # Inductor's first use of a fresh cache directory costs ~10 s of CPU probing: share one per run.
    # xdist workers inherit it through the environment.
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        path = tempfile.mkdtemp(prefix="conformance-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _header_up_front(config: pytest.Config) -> bool:
    """Whether the run is clearly a conformance run (the CLI always says so): then the header is part
    of pytest's own header. Otherwise it is printed after collection, and only if a conformance test
    was collected, so that a run of unrelated tests never probes (or imports torch)."""
    return config.getoption("backend") != "auto" or bool(config.getoption("conformance_report"))


def _is_conformance_item(item: pytest.Item) -> bool:
    return ("ranks" in getattr(item, "fixturenames", ())
            or item.get_closest_marker("requires") is not None
            or item.get_closest_marker("world_size") is not None
            or item.get_closest_marker("min_ranks") is not None
            or SUITES_DIR in item.path.parents)


def _session(config: pytest.Config):
    session = config.stash[SESSION_KEY]
    if session is None:
        from conformance.session import ConformanceSession, RunOptions

        options = RunOptions(backend=config.getoption("backend"), world_size=config.getoption("world_size"),
                             max_ranks=config.getoption("max_ranks"),
                             backends_dir=config.getoption("backends_dir"),
                             rank_timeout=config.getoption("rank_timeout"),
                             shared_dir=_shared_dir(config.getoption("shared_dir")))
        try:
            session = ConformanceSession.create(options)
        except DescriptorError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.stash[SESSION_KEY] = session
        session.watch_for_termination()
        # Normally closed at session finish; this also covers runs that never get there.
        config.add_cleanup(session.close)
    return session


def _shared_dir(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"--shared-dir {value}: cannot create it ({exc.strerror}); pass a directory "
                                "every node mounts and this user can write") from None
    return str(path)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    conformance_items = [item for item in items if _is_conformance_item(item)]
    if not conformance_items:
        return
    session = _session(config)
    session.expect_rank_imports(rank_imports(
        c for item in conformance_items for c in required_capabilities(item) if session.descriptor.declares(c)))
    if not config.getoption("collectonly"):
        _launch_default_pool(session, conformance_items)
    pool_sizes = config.pluginmanager.get_plugin(RUN_PLUGIN).pool_sizes
    for item in conformance_items:
        _apply_descriptor(session, item, pool_sizes)  # probes what these items need, while the ranks boot
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not _is_xdist_worker(config) and not _header_up_front(config):
        for line in session.header_lines():
            reporter.write_line(line)
    _freeze_what_lives_as_long_as_the_process()


def _freeze_what_lives_as_long_as_the_process() -> None:
    """Move every object alive now (torch, the suites, the session) out of the garbage collector's reach.

    They live as long as the process, and a full collection walks every one of them (about 0.1 s with
    torch alone): pytest runs two at its end, more come as a long run allocates. Freezing does not change
    what is freed by reference counting; the cost is that cyclic garbage made before this point is never
    collected. Once per process: the objects of a session run inside it (pytester's) stay collectable.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()


def _launch_default_pool(session, items: list[pytest.Item]) -> None:
    """Spawn the default pool's ranks now, without waiting: they import torch and form their group while
    this process probes capabilities and the first test sets up (the first run call waits for them)."""
    if any("ranks" in getattr(item, "fixturenames", ()) and required_world_size(item) in (None, session.world_size)
           for item in items):
        session.pool(session.world_size).launch()


def _apply_descriptor(session, item: pytest.Item, pool_sizes: dict[str, int]) -> None:
    """Skip or expect failure from the descriptor; record in ``pool_sizes`` the ranks of the pool ``item`` runs on."""
    for capability in required_capabilities(item):
        ok, why = session.capabilities.usable(capability)
        if not ok:
            item.add_marker(pytest.mark.skip(reason=f"requires {capability}: {why}"))
            return
    needed = required_world_size(item)
    if needed is not None and session.launcher is not None and needed != session.world_size:
        item.add_marker(pytest.mark.skip(
            reason=f"needs exactly {needed} ranks; the launcher's world has {session.world_size} and cannot be "
                   f"resized within a run (relaunch with --nnodes x --nproc-per-node = {needed})"))
        return
    if item.get_closest_marker("shared_dir") is not None and (why := session.shared_dir_missing()):
        item.add_marker(pytest.mark.skip(reason=why))
        return
    at_least = required_min_ranks(item)
    if at_least is not None and session.world_size < at_least:
        item.add_marker(pytest.mark.skip(
            reason=f"needs at least {at_least} ranks; this run has {session.world_size} "
                   f"(--world-size {at_least}{' and the devices' if session.descriptor.device_type != 'cpu' else ''})"))
        return
    if needed is not None and needed > session.available_ranks:
        item.add_marker(pytest.mark.skip(
            reason=f"needs {needed} ranks; {session.descriptor.name} run has {session.available_ranks} "
                   f"(--max-ranks {needed}{' and the devices' if session.descriptor.device_type != 'cpu' else ''})"))
        return
    pool_size = needed or session.world_size
    if "ranks" in getattr(item, "fixturenames", ()):
        item.user_properties.append((WORLD_SIZE_PROPERTY, pool_size))
    pool_sizes[item.nodeid] = pool_size
    known = session.descriptor.known_failure_for(test_id_of(item), pool_size, session.torch_version)
    if known is not None:
        item.user_properties.extend((KNOWN_FAILURE_PROPERTY + key, value) for key, value in
                                    known.model_dump(include={"match", "reason", "link", "torch"}).items()
                                    if value is not None)
        reason = f"known failure on {session.descriptor.name}: {known.reason} ({known.link})"
        if known.mode == "skip":
            item.add_marker(pytest.mark.skip(reason=reason))
        else:
            # Not strict by default: a known failure that passes is an unexpected pass (news), not a failure.
            strict = item.config.getoption("strict_known_failures")
            item.add_marker(pytest.mark.xfail(reason=reason, strict=strict))


def _known_failure(report: pytest.TestReport) -> KnownFailureApplied | None:
    fields = {name.removeprefix(KNOWN_FAILURE_PROPERTY): value for name, value in report.user_properties
              if name.startswith(KNOWN_FAILURE_PROPERTY)}
    return KnownFailureApplied(**fields) if fields else None


def _is_unexpected_pass(report: pytest.TestReport) -> bool:
    """A call whose known failure did not fail: pytest's xpass, or its strict xpass failure."""
    if report.when != "call" or not any(n.startswith(KNOWN_FAILURE_PROPERTY) for n, _ in report.user_properties):
        return False
    return (report.passed and hasattr(report, "wasxfail")) or \
        (report.failed and str(report.longrepr).startswith("[XPASS(strict)]"))


def _ranks_fixture_of(run: "ConformanceRun") -> types.ModuleType:
    """A plugin holding this config's ``ranks`` fixture, for ``run``.

    Session-scoped and taking no ``request``, so that a test pays no fixture set-up or teardown for it (a
    function-scoped one cost 0.03-0.04 ms of a trivial ranks test's 0.8 ms, and asking for ``request`` another
    0.04-0.05: pytest builds a new definition of ``request`` each time; bench/ranks_fixture_overhead.py). A
    function in a module, not a method of ``ConformanceRun``: pytest deprecates session-scoped methods."""

    @pytest.fixture(name="ranks", scope="session")
    def ranks_fixture() -> Ranks:
        """A persistent pool of ranks of the session's backend, of the test's world size; see ``conformance.ranks``."""
        return Ranks(run, _session(run.config))

    holder = types.ModuleType(f"{__name__}.ranks_fixture")
    holder.ranks_fixture = ranks_fixture
    return holder


class Ranks:
    """What the ``ranks`` fixture gives a test: ``run(fn, *args, **kwargs)`` on every rank of the test's pool.

    One for the whole run (the fixture is session-scoped, see ``_ranks_fixture_of``): the pools live as long
    as the session, and which one a test gets (its world size) is looked up at each use, from the test in
    progress.
    """

    def __init__(self, run: "ConformanceRun", session):
        self._run = run
        self.device: str = session.descriptor.device_type
        self.backend: str = session.descriptor.distributed_backend
        self.descriptor = session.descriptor
        self.capabilities = session.capabilities

    @property
    def pool(self):
        """The pool of the test in progress."""
        return self._run.pool_of_running_test()

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    def run(self, fn, *args, **kwargs) -> list:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; results in rank order."""
        __tracebackhide__ = True  # noqa: F841 - out of a failure's traceback (see RankPool.run)
        pool = self.pool
        return self._run_on(pool, pool.timeout, fn, args, kwargs)

    def run_with_timeout(self, timeout: float, fn, *args, **kwargs) -> list:
        __tracebackhide__ = True  # noqa: F841 - see run
        return self._run_on(self.pool, timeout, fn, args, kwargs)

    @staticmethod
    def _run_on(pool, timeout: float, fn, args: tuple, kwargs: dict) -> list:
        __tracebackhide__ = True  # noqa: F841 - see run
        lost = getattr(pool, "lost", None)
        if lost:  # a launcher's world that lost a process: nothing can run until it is relaunched
            pytest.skip(lost)
        return pool.run_with_timeout(timeout, fn, *args, **kwargs)


def _message(report: pytest.TestReport) -> str:
    if _is_unexpected_pass(report):
        reason = report.wasxfail if hasattr(report, "wasxfail") else str(report.longrepr)
        text = "passed: " + reason.removeprefix("[XPASS(strict)] ")
    elif hasattr(report, "wasxfail") and report.skipped:
        text = report.wasxfail
    elif report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2].removeprefix("Skipped: ")
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else report.longreprtext
    else:
        return ""
    return "\n".join(str(text).strip().splitlines()[:8])[:2000]


def _outcome(report: pytest.TestReport) -> str | None:
    if _is_unexpected_pass(report):
        return UNEXPECTED_PASS
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed"
        return report.outcome
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return None


def _ends_expected_to_fail(item: pytest.Item, call) -> bool:
    """Whether this phase's exception makes a conformance test "xfailed" (its xfail marker, a known failure's
    included, expects it), as pytest's skipping plugin will decide while the report is made."""
    if call.excinfo is None or item.config.getoption("runxfail", False) or not _is_conformance_item(item):
        return False
    try:
        from _pytest.skipping import xfailed_key
    except ImportError:  # a pytest that keeps it elsewhere: its failures are formatted in full
        return False
    xfailed = item.stash.get(xfailed_key, None)
    return xfailed is not None and (xfailed.raises is None or isinstance(call.excinfo.value, xfailed.raises))


def _made_with_a_brief_failure(item: pytest.Item):
    """Make the report (the hook's ``yield``) with the failure formatted briefly, each frame as its location and
    line, not as pytest's traceback of each frame's statement and arguments: nothing shows an expected failure's
    traceback (the summary, the JUnit file and the JSON report give the xfail reason), and formatting it cost
    8-12 ms of CPU per known failure (source files parsed, tensors repr'd), a third of the time pytest spent on
    the tests of a matrix suite with hundreds of them."""
    item.repr_failure = lambda excinfo: item._repr_failure_py(excinfo, style="line")
    try:
        return (yield)
    finally:
        del item.repr_failure


class ConformanceRun:
    """Per-config hooks: records every test report and writes the JSON report at the end.

    Under pytest-xdist the controller receives every worker's reports here, and each worker's pool
    events through ``workeroutput``.
    """

    def __init__(self, config: pytest.Config):
        self.config = config
        self.verdicts: dict[str, tuple[str, str, str]] = {}  # nodeid -> (suite, outcome, message)
        self.known_failures: dict[str, KnownFailureApplied] = {}
        self.world_sizes: dict[str, int] = {}  # tests that ran on ranks: the ranks of their pool
        self.durations: defaultdict[str, float] = defaultdict(float)
        self.worker_events: list[str] = []
        self.worker_probes: list[Probe] = []  # the capabilities pytest-xdist workers probed
        self.running: tuple[str, str] | None = None  # (nodeid, suite) of the test in progress
        self.pool_sizes: dict[str, int] = {}  # nodeid -> the ranks of the pool it runs on (found at collection)

    def pool_of_running_test(self):
        """The pool of the test in progress: of the size found at collection, else (a test no hook of this
        plugin saw ask for ``ranks``: it called ``getfixturevalue``) of the run's world size."""
        session = _session(self.config)
        world_size = self.pool_sizes.get(self.running[0], session.world_size) if self.running else session.world_size
        pool = session.pools.get(world_size)
        return pool if pool is not None else session.pool(world_size)

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.running = (nodeid, suite_name(location[0]))

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self.running = None

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        if not _header_up_front(config) or _is_xdist_worker(config):
            return []
        return _session(config).header_lines()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        # Outside pytest's skipping plugin, which has turned a passing xfail into an xpass by now.
        if _ends_expected_to_fail(item, call):
            report = yield from _made_with_a_brief_failure(item)
        else:
            report = yield
        if _is_unexpected_pass(report):
            item.user_properties.append((OUTCOME_PROPERTY, UNEXPECTED_PASS))  # the teardown report's too (JUnit)
            report.user_properties.append((OUTCOME_PROPERTY, UNEXPECTED_PASS))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Setup, call and teardown each report: every phase's time counts, the call's outcome is
        # the verdict unless a phase failed or skipped (an error in teardown overrides a pass).
        self.durations[report.nodeid] += max(report.duration, 0.0)
        outcome = _outcome(report)
        if outcome is not None and (outcome != "passed" or report.nodeid not in self.verdicts):
            self.verdicts[report.nodeid] = (suite_name(report.location[0]), outcome, _message(report))
        known = _known_failure(report)
        if known is not None:
            self.known_failures[report.nodeid] = known
        for name, value in report.user_properties:
            if name == WORLD_SIZE_PROPERTY:
                self.world_sizes[report.nodeid] = int(value)

    def results(self) -> list[TestResult]:
        return [TestResult(nodeid=nodeid, suite=suite, outcome=outcome, duration=self.durations[nodeid],
                           message=message, known_failure=self.known_failures.get(nodeid),
                           world_size=self.world_sizes.get(nodeid))
                for nodeid, (suite, outcome, message) in self.verdicts.items()]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        output = getattr(node, "workeroutput", {})
        worker = getattr(node, "gateway", None)
        self.worker_events.extend(f"{getattr(worker, 'id', 'worker')}: {event}"
                                  for event in output.get("conformance_events", []))
        self.worker_probes.extend(Probe(*probe) for probe in output.get("conformance_probes", []))

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        session = config.stash.get(SESSION_KEY, None)
        # Under pytest-xdist a controller that printed no header has no session: its workers' events still show.
        events = (session.events if session else []) + self.worker_events
        if session is None and not events:
            return
        terminalreporter.ensure_newline()  # ends the progress line here, not with a blank line in the section
        terminalreporter.section("conformance")
        if session is not None:
            session.capabilities.adopt(self.worker_probes)
            # The header may have been printed before collection, when no test had needed the costly probes.
            terminalreporter.write_line(
                "capabilities: " + session.capabilities.summary("not needed by the selected tests, not probed"))
            for line in session.capabilities.mismatches(probed_only=True):
                terminalreporter.write_line(f"declared/probed mismatch: {line}")
        for event, count in Counter(events).items():
            terminalreporter.write_line(event if count == 1 else f"{event} ({count} times)")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = self.config
        state = config.stash.get(SESSION_KEY, None)
        if state is not None:
            state.close()
            if _is_xdist_worker(config):
                config.workeroutput["conformance_events"] = state.events
                config.workeroutput["conformance_probes"] = [  # as tuples: what execnet carries
                    dataclasses.astuple(state.capabilities.probes[name]) for name in state.capabilities.probed]
        path = config.getoption("conformance_report")
        if _is_xdist_worker(config):
            return
        results = self.results()
        launcher = state is not None and state.launcher is not None
        if launcher:
            if state.terminated and self.running is not None:  # the test the launcher's SIGTERM cut short
                nodeid, suite = self.running
                results.append(TestResult(nodeid=nodeid, suite=suite, outcome="error", duration=self.durations[nodeid],
                                          message=f"interrupted: {state.terminated}"))
            # Every rank's verdicts, on rank 0; then no rank leaves before rank 0 has written the report.
            results = state.gather_results(results, int(exitstatus))
            if results is None:
                session.exitstatus = state.end_launcher_run(int(exitstatus))
                return
        if path:
            state = _session(config)
            state.capabilities.adopt(self.worker_probes)
            report = state.build_report(results, extra_events=self.worker_events)
            write_report(report, path)  # atomic: a cancelled run leaves no half-written report
        if launcher:
            failed = any(r.outcome in ("failed", "error") for r in results)
            code = int(exitstatus) or (1 if failed or state.lost_ranks or state.followers_failed else 0)
            session.exitstatus = state.end_launcher_run(code)
