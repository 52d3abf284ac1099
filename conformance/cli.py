"""The ``conformance`` command: ``run`` the packaged suites, show ``backends``, ``list`` the tests,
``callback`` the relay from CI (:mod:`conformance.callback`).

Runs pytest in-process on the installed ``conformance/suites`` (so it works from any directory),
then reads the JSON report it wrote to print a per-suite table. That pytest loads the suites' plugin and
pytest-xdist, not every plugin installed beside them (see :func:`run_pytest`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# The suites' modules (descriptors: pydantic and yaml; items: pytest) are imported by the commands that use them:
# ``conformance callback`` and ``preflight`` run in every CI job, the callback from the standard library alone.

COLUMNS = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed", "unexpected_passes")
HEADINGS = {"unexpected_passes": "unexpected passes"}


def available_suites() -> list[str]:
    from conformance.items import SUITES_DIR, suite_name

    return sorted(suite_name(p) for p in SUITES_DIR.glob("test_*.py"))


def _suite_paths(names: list[str] | None) -> list[str]:
    known = available_suites()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise SystemExit(f"conformance: unknown suite {', '.join(map(repr, unknown))}; "
                         f"available: {', '.join(known)}")
    from conformance.items import SUITES_DIR

    return [str(SUITES_DIR / f"test_{n}.py") for n in (names or known)]


def run_pytest(argv: list[str], plugins: Sequence[object] = ()) -> int:
    """``pytest.main`` with only the plugins a run needs: the suites' own, and pytest-xdist (``-n``) when
    it is installed. Others installed in the environment are not loaded: one that reorders tests or
    re-runs failures would change what a run means, and importing them all costs every process of a run
    (each rank under torchrun) about a second where the environment has many. ``-- -p NAME`` adds one."""
    import pytest

    explicit = ["-p", "conformance.plugin"]
    if importlib.util.find_spec("xdist") is not None:
        explicit += ["-p", "xdist.plugin"]
    # The variable, not pytest's --disable-plugin-autoload, which pytest before 8.4 lacks; it stays set
    # for the run, so xdist's workers load the same plugins.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        return int(pytest.main(explicit + argv, plugins=list(plugins)))


def _common_pytest_args(args: argparse.Namespace) -> list[str]:
    out = ["--backend", args.backend, "-p", "no:cacheprovider"]
    if getattr(args, "strict_known_failures", False):
        out.append("--strict-known-failures")
    if args.world_size:
        out += ["--world-size", str(args.world_size)]
    if not getattr(args, "single_world_size", True):
        out += ["--max-ranks", args.max_ranks]
    if args.backends_dir:
        out += ["--backends-dir", args.backends_dir]
    return out


def _launch_pytest_args(args: argparse.Namespace) -> list[str]:
    """``run``'s options about the ranks themselves (how long a call may take, where they share files)."""
    out = []
    if args.rank_timeout is not None:
        out += ["--rank-timeout", str(args.rank_timeout)]
    if args.shared_dir is not None:
        out += ["--shared-dir", args.shared_dir]
    return out


def format_table(report) -> str:
    rows = [("suite", *(HEADINGS.get(c, c) for c in COLUMNS))]
    for suite, s in report.suites().items():
        rows.append((suite, *(str(getattr(s, c)) for c in COLUMNS)))
    s = report.summary
    rows.append(("total", *(str(getattr(s, c)) for c in COLUMNS)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)


def rank_lines(report) -> list[str]:
    """Under a launcher: each test that did not pass on every rank, with every rank's outcome and node."""
    lines = []
    for test in report.tests:
        outcomes = {r.outcome for r in test.ranks}
        if not test.ranks or outcomes <= {"passed"} or (len(outcomes) == 1 and test.outcome in ("skipped", "xfailed")):
            continue
        lines.append(f"  {test.nodeid}: " + "; ".join(f"rank {r.rank} ({r.node}) {r.outcome}" for r in test.ranks))
    if lines:
        lines.insert(0, "per rank (launcher world):")
    return lines


def unexpected_pass_lines(report) -> list[str]:
    """Each known-failure entry whose tests passed, to bound (``torch:``) or remove: news, not a failure."""
    by_entry: dict[str, list] = {}
    for test in report.tests:
        if test.outcome == "unexpected_pass" and test.known_failure is not None:
            by_entry.setdefault(test.known_failure.match, []).append(test)
    if not by_entry:
        return []
    from packaging.version import Version

    below = f"<{Version(report.torch.version).public}"
    lines = [f"UNEXPECTED PASSES: {report.summary.unexpected_passes} tests that known failures of "
             f"{report.backend.name} cover passed on torch {report.torch.version}; bound each entry below "
             f"(torch: \"{below}\", or tighter) or remove it:"]
    for match, tests in by_entry.items():
        entry = tests[0].known_failure
        bound = f"torch: \"{entry.torch},{below}\"" if entry.torch else f"torch: \"{below}\""
        lines.append(f"  {match!r} ({len(tests)} test{'s' if len(tests) > 1 else ''}; {bound}): "
                     f"{entry.reason} ({entry.link})")
    return lines


def world_size_line(report) -> str | None:
    """How many tests ran (not skipped) on pools of each size, and how many without ranks."""
    ran = [t for t in report.tests if t.outcome != "skipped"]
    sizes = Counter(t.world_size for t in ran if t.world_size is not None)
    if not sizes:
        return None
    parts = [f"{count} on {size} ranks" for size, count in sorted(sizes.items())]
    if without := sum(t.world_size is None for t in ran):
        parts.append(f"{without} without ranks")
    return "tests run: " + ", ".join(parts)


def lack_of_ranks(report) -> str | None:
    """A line saying how many tests were skipped for lack of ranks and how to run them, or None.

    Reads the skip reason the plugin gives (``needs N ranks; ...``)."""
    needed = [int(m.group(1)) for t in report.tests if t.outcome == "skipped"
              and (m := re.match(r"needs (\d+) ranks", t.message))]
    if not needed:
        return None
    most = max(needed)
    how = (f"conformance run --max-ranks {most}" if report.backend.device_type == "cpu"
           else f"conformance run --max-ranks {most} on a machine with {most} {report.backend.device_type} devices")
    return f"{len(needed)} tests skipped for lack of ranks (they need up to {most}); run them with: {how}"


def cmd_run(args: argparse.Namespace) -> int:
    from conformance.report import load_report

    from conformance.ranks.launcher import LauncherWorld

    world = LauncherWorld.from_env()
    follower = world is not None and world.rank != 0  # under torchrun only rank 0 reports
    if world is not None and any(a in ("-n", "--numprocesses") or a.startswith("-n") for a in args.pytest_args):
        raise SystemExit("conformance: under torchrun every launcher process is one rank running the whole "
                         "session; pytest-xdist (-n) cannot be combined with it")
    with tempfile.TemporaryDirectory(prefix="conformance-run-") as tmp:
        report_path = args.report or str(Path(tmp) / "report.json")
        pytest_args = _suite_paths(args.suite) + _common_pytest_args(args)
        pytest_args += ["--conformance-report", report_path] + _launch_pytest_args(args)
        if follower:
            pytest_args += ["-p", "no:terminal"]  # rank 0 prints the run, every rank's outcome included
        else:
            pytest_args += ["-rfEX"] + (["--junitxml", args.junit] if args.junit else [])
        pytest_args += args.pytest_args
        code = run_pytest(pytest_args)
        if follower:
            return code
        if not Path(report_path).exists():
            return code or 2
        report = load_report(report_path)
    print()
    print(f"conformance on {report.backend.name} ({report.backend.distributed_backend}, "
          f"{report.backend.world_size} ranks, torch {report.torch.version}):")
    print(format_table(report))
    if sizes := world_size_line(report):
        print(sizes)
    for line in rank_lines(report):
        print(line)
    short = lack_of_ranks(report)
    if short:
        print(short)
    for line in unexpected_pass_lines(report):
        print(line)
    if args.report:
        print(f"report: {args.report}")
    unexpected = report.summary.failed + report.summary.errors
    if args.strict_known_failures:
        unexpected += report.summary.unexpected_passes
    if code == 0 and unexpected:
        return 1
    return code


def cmd_backends(args: argparse.Namespace) -> int:
    from conformance.capabilities import probe_capabilities
    from conformance.descriptors import CAPABILITIES, DescriptorError, load_descriptors
    from conformance.detect import detect_backend, resolve_backend

    try:
        descriptors = load_descriptors(args.backends_dir)
    except DescriptorError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    try:
        detected = detect_backend(descriptors).name
    except DescriptorError as exc:
        detected, why = None, str(exc)
    print(f"{'name':10} {'device':8} {'dist':8} {'ranks':5} source")
    for d in descriptors.values():
        mark = "  <- detected here" if d.name == detected else ""
        print(f"{d.name:10} {d.device_type:8} {d.distributed_backend:8} {d.world_size:<5} {d.source}{mark}")
    if detected is None:
        print(f"\nno descriptor matches this machine: {why}")
        if args.backend == "auto":
            return 1
    try:
        shown = resolve_backend(detected if args.backend == "auto" else args.backend, descriptors)
    except DescriptorError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    # The device-touching probes on one rank of the backend (this process touches no device).
    from conformance.ranks import RankPool, fork_server_here

    fork_server_here(shown.device_type)
    with RankPool(descriptor=shown.name, device_type=shown.device_type, backend=shown.distributed_backend,
                  world_size=1, setup_modules=shown.setup_modules,
                  symmetric_memory_backend=shown.symmetric_memory_backend) as pool:
        report = probe_capabilities(shown, on_ranks=pool.probed_on_ranks)
        for name in CAPABILITIES:
            report.probes[name]
    print(f"\ncapabilities of {shown.name} (declared vs probed here):")
    for name in CAPABILITIES:
        probe = report.probes[name]
        declared = "yes" if shown.declares(name) else "no"
        probed = "yes" if probe.available else "no"
        flag = "" if shown.declares(name) == probe.available else "  MISMATCH"
        reason = f"  ({probe.reason})" if probe.reason else ""
        print(f"  {name:17} declared {declared:3}  probed {probed:3}{flag}{reason}")
    return 0 if detected else 1


class _Lister:
    """Collects the suites and prints each test with what it needs and what will happen here."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.errors: list[str] = []

    def pytest_collectreport(self, report) -> None:
        # pytest's terminal reporter is off (it would print its own listing): say what broke.
        if report.failed:
            self.errors.append(f"conformance: cannot collect {report.nodeid}:\n{report.longreprtext}")

    def pytest_collection_finish(self, session) -> None:
        from conformance.items import required_capabilities, required_world_size, test_id_of

        for item in session.items:
            needs = ", ".join(required_capabilities(item)) or "-"
            ranks = required_world_size(item)
            fate = ""
            for marker in item.iter_markers():
                if marker.name in ("skip", "xfail"):
                    fate = f"  [{marker.name}: {marker.kwargs.get('reason', '')}]"
                    break
            self.lines.append(f"{test_id_of(item)}  requires: {needs}"
                              f"{f'  ranks: {ranks}' if ranks else ''}{fate}")


def cmd_list(args: argparse.Namespace) -> int:
    lister = _Lister()
    code = run_pytest(_suite_paths(args.suite) + _common_pytest_args(args) + ["--collect-only", "-p", "no:terminal"],
                      plugins=[lister])
    for error in lister.errors:
        print(error, file=sys.stderr)
    if code != 0:  # a usage or collection error (already shown): a partial list would mislead
        return code
    print_whole("\n".join(lister.lines + [f"{len(lister.lines)} tests"]))
    return 0


def print_whole(text: str, stream=None) -> None:
    """Print ``text`` and a newline to ``stream`` (stdout), all of it. Unbuffered (``PYTHONUNBUFFERED``,
    ``-u``), Python's ``print`` hands a long text to one write(2) and drops what that call did not take; a
    write to a full pipe that a signal interrupts takes part of it. A listing cut short that way would still
    exit 0."""
    stream = sys.stdout if stream is None else stream
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it (a captured stream): its write is whole
        stream.write(text + "\n")
        return
    stream.flush()
    rest = memoryview((text + "\n").encode(stream.encoding or "utf-8", errors="replace"))
    while rest:
        rest = rest[os.write(fd, rest):]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conformance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, world_size: bool = True) -> None:
        p.add_argument("--backend", default="auto", help="descriptor name, or auto to detect (default)")
        if world_size:
            p.add_argument("--world-size", type=int, default=None, help="ranks (default: the descriptor's)")
            p.add_argument("--max-ranks", default="all", metavar="N|all",
                           help="most ranks a test that needs more than the world size gets, in a pool of its "
                                "own (default: all, any number on cpu, the device count on an accelerator)")
            p.add_argument("--single-world-size", action="store_true",
                           help="one pool of the world size; tests that need more ranks skip")
        p.add_argument("--backends-dir", default=None,
                       help="extra descriptor directory; overrides packaged descriptors of the same name")

    run = sub.add_parser("run", help="run the conformance suites on this machine")
    common(run)
    run.add_argument("--suite", action="append", help="suite to run, repeatable (default: all)")
    run.add_argument("--report", default=None, help="write the JSON report here")
    run.add_argument("--junit", default=None, help="write a JUnit XML report here")
    run.add_argument("--rank-timeout", type=float, default=None,
                     help="seconds a call on the ranks may take before they are replaced (default 300)")
    run.add_argument("--shared-dir", default=None,
                     help="a directory every rank sees, on a file system every node mounts (default: one per host)")
    run.add_argument("--strict-known-failures", action="store_true",
                     help="exit 1 when a known failure passes (default: an unexpected pass is reported, exit 0)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER,
                     help="after --: extra pytest arguments (e.g. -- -k all_reduce -x)")
    run.set_defaults(func=cmd_run)

    backends = sub.add_parser("backends", help="descriptors, the one detected here, its capabilities")
    common(backends, world_size=False)
    backends.set_defaults(func=cmd_backends)

    lst = sub.add_parser("list", help="the tests and the capabilities each needs")
    common(lst)
    lst.add_argument("--suite", action="append", help="suite to list, repeatable (default: all)")
    lst.set_defaults(func=cmd_list)

    from conformance.callback import register as register_callback  # torch-free, stdlib HTTP

    register_callback(sub)
    from conformance.preflight import register as register_preflight  # the CI job's checks before the suite

    register_preflight(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
