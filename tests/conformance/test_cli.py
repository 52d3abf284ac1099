"""The ``conformance`` command, run as a user would: installed entry point, from a temporary directory
(forked from a server that has imported torch, as a fresh one would run: tests/forked_commands.py)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import signal
import shutil
import subprocess
import sys
import threading
import time

import yaml

from conformance.descriptors import packaged_backends_dir
from conformance.report import validate_report
from tests import forked_commands


def conformance(*args, cwd):
    exe = shutil.which("conformance") or [sys.executable, "-m", "conformance.cli"]
    cmd = ([exe] if isinstance(exe, str) else exe) + list(args)
    return forked_commands.run(cmd, cwd=cwd, timeout=600)


def test_run_end_to_end_from_a_temporary_directory(tmp_path):
    result = conformance("run", "--suite", "collectives", "--report", "out/report.json", "--junit", "junit.xml",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = validate_report(json.loads((tmp_path / "out/report.json").read_text()))
    assert report.backend.name == "cpu" and report.summary.failed == 0
    assert report.summary.xfailed >= 1  # gloo's PREMUL_SUM, visible as a known failure
    table = result.stdout[result.stdout.index("conformance on cpu"):]
    counts = report.suites()["collectives"]
    assert f"collectives  {counts.passed:>6}       0       0" in table
    assert "total" in table
    assert (tmp_path / "junit.xml").read_text().startswith("<?xml")
    assert not (tmp_path / ".pytest_cache").exists()
    # The header comes before collection, the closing summary after the run: only it knows what was not needed.
    assert "(?: probed only if a selected test needs it)" in result.stdout
    lines = result.stdout.splitlines()
    section = next(i for i, line in enumerate(lines) if line.strip("= ") == "conformance" and line.startswith("="))
    assert lines[section + 1].startswith("capabilities: collectives=yes dtensor=? compile=? "), lines[section:section + 2]
    assert "(?: not needed by the selected tests, not probed)" in result.stdout
    # The command does not import the plugin before pytest loads it (pytest would warn that it cannot
    # rewrite the plugin's assertions, in every run's summary).
    assert "PytestAssertRewriteWarning" not in result.stdout + result.stderr


def test_run_exits_non_zero_when_a_known_failure_is_not_declared(tmp_path):
    data = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    data["known_failures"] = []
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    result = conformance("run", "--suite", "collectives", "--backends-dir", str(tmp_path), "--report", "r.json",
                         "--", "-k", "test_all_reduce and PREMUL_SUM and float32", cwd=tmp_path)
    assert result.returncode == 1
    report = validate_report(json.loads((tmp_path / "r.json").read_text()))
    assert report.summary.failed == 1
    assert "Cannot use ReduceOp.PREMUL_SUM with Gloo" in report.tests[0].message


def test_an_unexpected_pass_is_named_with_its_entry_and_does_not_fail_the_run(tmp_path):
    data = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    data["known_failures"] = [{"match": "collectives::test_all_reduce[SUM-float32]", "reason": "a bug fixed since",
                               "link": "https://example.org/fixed", "torch": ">=2.12"}]
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
    args = ("run", "--suite", "collectives", "--backends-dir", str(tmp_path), "--report", "r.json",
            "--", "-k", "test_all_reduce and (SUM-float32 or SUM-int64) and not PREMUL")
    result = conformance(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = validate_report(json.loads((tmp_path / "r.json").read_text()))
    assert (report.summary.passed, report.summary.unexpected_passes, report.summary.failed) == (1, 1, 0)
    table = result.stdout[result.stdout.index("conformance on cpu"):]
    assert "xpassed  unexpected passes" in table.splitlines()[1]
    assert table.splitlines()[3].split() == ["collectives", "1", "0", "0", "0", "0", "0", "1"]
    version = report.torch.version.split("+")[0]
    assert (f"UNEXPECTED PASSES: 1 tests that known failures of cpu cover passed on torch {report.torch.version}; "
            f"bound each entry below (torch: \"<{version}\", or tighter) or remove it:") in result.stdout
    assert (f"  'collectives::test_all_reduce[SUM-float32]' (1 test; torch: \">=2.12,<{version}\"): a bug fixed since "
            "(https://example.org/fixed)") in result.stdout

    strict = conformance(*args[:-3], "--strict-known-failures", *args[-3:], cwd=tmp_path)
    assert strict.returncode == 1, strict.stdout[-3000:] + strict.stderr[-3000:]
    assert "[XPASS(strict)] known failure on cpu: a bug fixed since" in strict.stdout


def test_unknown_suite_is_refused(tmp_path):
    result = conformance("run", "--suite", "nope", cwd=tmp_path)
    assert result.returncode == 1
    assert "unknown suite 'nope'; available: collective_layouts, collectives, dtensor, " in result.stderr


def test_backends_shows_detection_and_declared_vs_probed(tmp_path):
    result = conformance("backends", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "<- detected here" in [l for l in result.stdout.splitlines() if l.startswith("cpu ")][0]
    assert "symmetric_memory  declared no   probed no   (SymmetricMemory does not support device type cpu)" \
        in result.stdout


def test_backends_reports_an_invalid_user_descriptor(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: bad\n")
    result = conformance("backends", "--backends-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{tmp_path / 'bad.yaml'}: invalid backend descriptor" in result.stderr
    assert "device_type: Field required -> add 'device_type'" in result.stderr


def test_list_shows_capabilities_and_fate(tmp_path):
    result = conformance("list", "--suite", "collectives", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "collectives::test_barrier  requires: collectives" in lines
    premul = [l for l in lines if l.startswith("collectives::test_all_reduce[PREMUL_SUM-float32]")][0]
    assert "[xfail: known failure on cpu: gloo has no PREMUL_SUM reduction" in premul


def test_a_listing_reaches_a_slow_pipe_whole_while_signals_interrupt_its_writes():
    """Unbuffered, as under PYTHONUNBUFFERED; a one-page pipe read slowly, and a signal every millisecond
    while the listing is written: ``print`` loses most of it here, ``print_whole`` none."""
    from conformance.cli import print_whole

    text = "\n".join(f"collectives::test_{i:05d}  requires: collectives" + " " * 40 for i in range(1000))

    def received(write) -> bytes:
        read_end, write_end = os.pipe()
        fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe Linux gives
        got = bytearray()

        def read_slowly():
            with os.fdopen(read_end, "rb", buffering=0) as pipe:
                while chunk := pipe.read(4096):
                    got.extend(chunk)
                    time.sleep(0.002)

        reader = threading.Thread(target=read_slowly)
        reader.start()
        stream = io.TextIOWrapper(io.FileIO(write_end, "w"), write_through=True)  # what -u makes stdout
        previous = signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        try:
            write(stream)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            stream.close()
            reader.join()
        return bytes(got)

    assert len(received(lambda stream: print(text, file=stream))) < len(text)  # the harness does interrupt
    assert received(lambda stream: print_whole(text, stream)).decode() == text + "\n"


def test_backends_refuses_an_unknown_backend_by_name(tmp_path):
    result = conformance("backends", "--backend", "tpu", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown backend 'tpu'; known: cpu, cuda, rocm, xpu or auto" in result.stderr


def test_list_with_a_bad_option_prints_the_error_and_no_tests(tmp_path):
    result = conformance("list", "--suite", "collectives", "--backend", "tpu", cwd=tmp_path)
    assert result.returncode == 4
    assert "unknown backend 'tpu'; known: cpu, cuda, rocm, xpu or auto" in result.stderr
    assert result.stdout == ""


def test_list_names_a_suite_that_cannot_be_collected(tmp_path, monkeypatch, capsys):
    from conformance import cli, items

    (tmp_path / "test_broken.py").write_text("import no_such_module_for_conformance\n")
    monkeypatch.setattr(items, "SUITES_DIR", tmp_path)  # where the command finds its suites
    monkeypatch.chdir(tmp_path)
    assert cli.main(["list"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "conformance: cannot collect test_broken.py:" in err
    assert "No module named 'no_such_module_for_conformance'" in err


def test_run_gives_a_test_that_needs_more_ranks_a_pool_of_its_size_and_says_how_many_ran_on_each(tmp_path):
    args = ("run", "--suite", "p2p", "--report", "r.json", "--", "-k", "other_than_0 or tags")
    result = conformance(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = validate_report(json.loads((tmp_path / "r.json").read_text()))
    sizes = {t.nodeid.split("::")[-1]: (t.outcome, t.world_size) for t in report.tests}
    assert sizes["test_send_recv_between_ranks_other_than_0"] == ("passed", 4)
    tags = [s for name, s in sizes.items() if name.startswith("test_isend_irecv_tags")]
    assert tags and set(tags) == {("passed", 2)}
    assert f"tests run: {len(tags)} on 2 ranks, 1 on 4 ranks\n" in result.stdout
    assert "lack of ranks" not in result.stdout

    result = conformance(*args[:5], "--single-world-size", *args[5:], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = validate_report(json.loads((tmp_path / "r.json").read_text()))
    skipped = [t for t in report.tests if t.outcome == "skipped"]
    assert [t.nodeid.split("::")[-1] for t in skipped] == ["test_send_recv_between_ranks_other_than_0"]
    assert f"tests run: {len(tags)} on 2 ranks\n" in result.stdout
    assert ("1 tests skipped for lack of ranks (they need up to 4); run them with: conformance run --max-ranks 4"
            in result.stdout)


def test_the_documented_slurm_line_parses_for_torchrun_and_for_conformance_run():
    """docs' SLURM job: its srun line is a torchrun command line, and what follows ``-m conformance`` is a
    ``conformance run`` command line (``--rank-timeout`` and ``--shared-dir`` included)."""
    import shlex

    from torch.distributed.run import get_args_parser

    from conformance.cli import _launch_pytest_args, build_parser
    from tests.conformance.test_torchrun import doc_commands

    lines = doc_commands("SLURM")
    assert lines[0].startswith("head=$(scontrol show hostnames")
    srun = next(line for line in lines if line.startswith("srun torchrun "))
    for name, value in {"$SLURM_NNODES": "2", "$head": "node-a", "$SLURM_JOB_ID": "4242", "$HOME": "/home/u"}.items():
        srun = srun.replace(name, value)
    launcher = get_args_parser().parse_args(shlex.split(srun)[2:])
    assert (launcher.nnodes, launcher.nproc_per_node, launcher.rdzv_backend, launcher.rdzv_endpoint,
            launcher.rdzv_id) == ("2", "8", "c10d", "node-a:29500", "4242")
    assert launcher.module and launcher.training_script == "conformance"
    run = build_parser().parse_args(launcher.training_script_args)
    assert (run.command, run.report) == ("run", "report-4242.json")
    assert _launch_pytest_args(run) == ["--rank-timeout", "600.0", "--shared-dir", "/home/u/conformance-shared"]


def test_a_run_loads_its_own_plugins_not_every_plugin_installed_beside_them(tmp_path):
    """An installed pytest plugin (here one that says it was imported) is loaded by a plain pytest but not
    by the pytest a conformance run starts, unless asked for with ``-p``; pytest-xdist's ``-n`` still parses."""
    site = tmp_path / "site"
    (site / "noisy_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "noisy_plugin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: noisy-plugin\nVersion: 1.0\n")
    (site / "noisy_plugin-1.0.dist-info" / "entry_points.txt").write_text("[pytest11]\nnoisy = noisy_plugin\n")
    (site / "noisy_plugin.py").write_text(
        "import os\nopen(os.path.join(os.environ['MARKS'], str(os.getpid())), 'w').close()\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARKS": str(marks), "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)

    def loaded(command: list[str]) -> bool:
        before = set(marks.iterdir())
        done = subprocess.run(command + [str(tmp_path / "test_one.py"), "-q", "-p", "no:cacheprovider"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return set(marks.iterdir()) != before

    via_run = [sys.executable, "-c", "import sys; from conformance.cli import run_pytest; sys.exit(run_pytest(sys.argv[1:]))"]
    assert loaded([sys.executable, "-m", "pytest"]), "the stand-in plugin is not installed: the check below proves nothing"
    assert not loaded(via_run + ["-n", "0"])
    assert loaded(via_run + ["-p", "noisy_plugin"])


def test_the_ci_jobs_callback_and_preflight_commands_load_none_of_the_suites_modules():
    """``conformance callback`` and ``preflight`` run in every CI job, around the suite: their command line
    imports neither pytest nor the descriptors' schema. pytest comes with the ``runner`` extra, which the job
    installs after the package: when that install fails, the job's last step still reports with ``conformance
    callback`` (before, its import of pytest failed, and the relay heard of the run only at its time-out)."""
    script = ("import json, sys; from conformance.cli import build_parser; parser = build_parser(); "
              "[parser.parse_args(argv) for argv in (['callback', 'in-progress'], ['preflight', 'torch'])]; "
              "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert loaded.isdisjoint({"pytest", "_pytest", "pydantic", "yaml", "torch", "jsonschema"}), loaded
