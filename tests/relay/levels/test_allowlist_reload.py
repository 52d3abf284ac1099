"""A level change (a descriptor reload: SIGHUP or the files' content) reconciles the checks of open PRs:
L4 -> L3 turns the checks on PRs without the label neutral, L3/L4 -> L2 finalizes them as no longer
reported, L2 -> L3/L4 reports the latest results on open PRs. Real store, fake GitHub over HTTP."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time

import yaml

from relay.levels.allowlist_reload import DescriptorReload
from relay.results.reporter import CHECK_RUN
from relay.store.base import utcnow
from relay.testing import loopback_client
from tests.relay.helpers import RelayProcess, pr_payload, write_backend
from tests.relay.results_fixtures import app_mode, oidc_issuer, results_backends, results_relay  # noqa: F401

# Reloads happen by hand in these tests (check_once); the watch's own thread waits an hour.
MANUAL = dict(descriptor_check_seconds=0, level_watch_seconds=3600)


def set_level(backends, name, level):
    path = backends / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["relay"]["level"] = level
    path.write_text(yaml.safe_dump(data))


def settle(relay):
    assert relay.parts.results.reporting.wait_idle(30)


def check_of(relay, backend, number, head_sha="a" * 40):
    (run,) = relay.store.runs(backend=backend, pr_number=number, head_sha=head_sha)
    found = [c for c in relay.fake.check_runs.values() if c["external_id"] == str(run.id)]
    return found[0] if found else None


def started(drive, backend, number, *, labels=(), head_sha="a" * 40, run_id=5001):
    nonce = drive.nonce(backend, drive.open_pr(number, labels=labels, head_sha=head_sha))
    assert drive.start(backend, nonce, run_id=run_id).status_code == 200
    return nonce


def finished(drive, backend, number, conclusion="failure", **kw):
    nonce = started(drive, backend, number, **kw)
    assert drive.complete(backend, nonce, conclusion, run_id=kw.get("run_id", 5001)).status_code == 200
    return nonce


def reconcile_by_hand(relay, backends, backend, level, expected_change, expected):
    """Stop the reporting worker, change the level, check what each pass would take (bounded by its
    batch, open PRs' heads only), then report those runs through the reporter as the worker does;
    ``expected``: {(backend, PR, head): outcome}."""
    relay.parts.results.reporting.stop()
    set_level(backends, backend, level)
    assert relay.parts.descriptors.check_once() == expected_change
    since = utcnow() - dt.timedelta(days=1)
    assert len(relay.store.reports_pending(CHECK_RUN, since=since, limit=1)) == 1  # a pass takes at most its batch
    reporter = relay.parts.results.reporter
    outcomes = {(row.run.backend, row.run.pr_number, row.run.head_sha): reporter.report(row)
                for row in relay.store.reports_pending(CHECK_RUN, since=since, limit=50)}
    assert outcomes == expected
    assert relay.store.reports_pending(CHECK_RUN, since=since, limit=50) == []


def close(relay, number):
    payload = pr_payload("closed", number=number, updated_at="2024-05-02T10:00:00Z")
    payload["pull_request"]["state"] = "closed"
    assert relay.post("pull_request", payload).status_code in (200, 202)
    relay.wait_settled()


def test_l4_to_l3_turns_the_checks_of_open_prs_without_the_label_neutral(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **MANUAL)
    running = started(drive, "l4", 60)
    finished(drive, "l4", 61)
    finished(drive, "l4", 62, labels=("ciflow/crcr/l4",))
    finished(drive, "l4", 63)
    close(relay, 63)
    settle(relay)
    assert check_of(relay, "l4", 60)["status"] == "in_progress"
    assert [check_of(relay, "l4", n)["conclusion"] for n in (61, 62, 63)] == ["failure"] * 3

    # Closed #63 is left out.
    reconcile_by_hand(relay, results_backends, "l4", "L3", {"l4": ("L4", "L3")},
                      {("l4", n, "a" * 40): "reported" for n in (60, 61, 62)})
    for number in (60, 61):  # no label: finalized neutral, saying why
        check = check_of(relay, "l4", number)
        assert (check["status"], check["conclusion"]) == ("completed", "neutral")
        assert check["output"]["title"] == ("crcr/l4: no longer blocking: l4 is now L3, whose check shows only on "
                                            "PRs labelled ciflow/crcr/l4")
    labelled = check_of(relay, "l4", 62)  # the label keeps it on the PR: non-blocking, with its results
    assert labelled["conclusion"] == "neutral" and "1 passed, 1 failed" in labelled["output"]["title"]
    assert check_of(relay, "l4", 63)["conclusion"] == "failure"  # a closed PR is left as it was

    # The run still going finishes: its check stays as finalized (the PR has no label).
    assert drive.complete("l4", running, "failure").status_code == 200
    since = utcnow() - dt.timedelta(days=1)
    (finishing,) = relay.store.reports_pending(CHECK_RUN, since=since, limit=50)
    assert relay.parts.results.reporter.report(finishing) == "not_shown"  # nothing more is written
    assert check_of(relay, "l4", 60)["output"]["title"].startswith("crcr/l4: no longer blocking")
    assert loopback_client().get(f"{relay.url}/api/backends/l4").json()["level"] == "L3"


def test_l4_to_l2_finalizes_open_checks_as_no_longer_reported_and_ends_its_hold(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **MANUAL)
    started(drive, "l4", 70)
    finished(drive, "l3", 71, labels=("ciflow/crcr/l3",))
    settle(relay)
    relay.store.start_level_hold("l4", "L4", "success rate 0% misses the L4 bar")
    set_level(results_backends, "l3", "L2")
    reconcile_by_hand(relay, results_backends, "l4", "L2", {"l3": ("L3", "L2"), "l4": ("L4", "L2")}, {
        ("l4", 70, "a" * 40): "reported", ("l4", 71, "a" * 40): "reported",  # both were on their PRs
        ("l3", 71, "a" * 40): "reported", ("l3", 70, "a" * 40): "not_shown"})  # #70 had no l3 label
    for backend, number in (("l4", 70), ("l3", 71)):
        check = check_of(relay, backend, number)
        assert (check["status"], check["conclusion"]) == ("completed", "neutral")
        assert check["output"]["title"] == (f"crcr/{backend}: no longer reported: {backend} is now L2, "
                                            "whose results show on the dashboard only")
    (hold,) = relay.store.level_holds("l4")
    assert hold.ended_by == "level changed: L4 -> L2"  # a person decided its level
    set_level(results_backends, "l4", "L1")  # a later change says so again
    assert relay.parts.descriptors.check_once() == {"l4": ("L2", "L1")}
    since = utcnow() - dt.timedelta(days=1)
    reporter = relay.parts.results.reporter
    assert [reporter.report(r) for r in relay.store.reports_pending(CHECK_RUN, since=since, limit=50)] == ["reported"] * 2
    for number in (70, 71):
        assert check_of(relay, "l4", number)["output"]["title"].startswith("crcr/l4: no longer reported: l4 is now L1")


def test_l2_to_l4_reports_the_latest_results_of_open_prs(
        database_url, results_relay, results_backends, app_mode):  # noqa: F811
    relay, drive = results_relay(database_url, **app_mode, **MANUAL)
    finished(drive, "l2", 80)
    finished(drive, "l2", 81, head_sha="1" * 40, run_id=5101)
    drive.open_pr(81, action="synchronize", head_sha="2" * 40, updated_at="2024-05-01T11:00:00Z")
    finished(drive, "l2", 82, run_id=5201)
    close(relay, 82)
    settle(relay)
    assert not [c for c in relay.fake.check_runs.values() if c["name"] == "crcr/l2"]  # L2: dashboard only

    # Open PRs' heads only: not #81's old head, not closed #82.
    reconcile_by_hand(relay, results_backends, "l2", "L4", {"l2": ("L2", "L4")},
                      {("l2", 80, "a" * 40): "reported", ("l2", 81, "2" * 40): "reported"})
    assert check_of(relay, "l2", 80)["conclusion"] == "failure"  # L4 blocks: the real conclusion
    assert check_of(relay, "l2", 81, head_sha="2" * 40)["status"] == "queued"
    assert check_of(relay, "l2", 81, head_sha="1" * 40) is None and check_of(relay, "l2", 82) is None


def test_a_descriptor_that_does_not_load_keeps_the_allowlist_in_use(
        database_url, results_relay, results_backends):  # noqa: F811
    relay, drive = results_relay(database_url, **MANUAL)
    (results_backends / "l4.yaml").write_text("name: l4\nrelay: {level: L9}\n")
    reload = relay.parts.descriptors
    assert reload.check_once() is None
    assert "l4.yaml" in reload.last_error
    assert loopback_client().get(f"{relay.url}/api/backends/l4").json()["level"] == "L4"
    assert reload.check_once() is None  # unchanged since: not tried again
    set_level_ok = results_backends / "l3.yaml"
    (results_backends / "l4.yaml").write_text(set_level_ok.read_text().replace("l3", "l4").replace("L3", "L4"))
    set_level(results_backends, "l4", "L3")
    assert reload.check_once() == {"l4": ("L4", "L3")} and reload.last_error is None


class SlowSync:
    """A store whose sync_backends waits until released, so a reload can be caught half done."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def sync_backends(self, targets):
        self.entered.set()
        assert self.release.wait(30)
        return {}


def test_a_check_during_the_threads_reload_waits_for_it(tmp_path):
    # The reload thread's pass and a direct check (a test, SIGHUP's) once interleaved: the second saw
    # the new digest and returned before the first had applied the files or recorded its error.
    write_backend(tmp_path, "l4", "org/l4-ci", "L4")
    applied, store = [], SlowSync()
    reload = DescriptorReload(tmp_path, store, applied.append, interval_seconds=0)
    write_backend(tmp_path, "l4", "org/l4-ci", "L3")
    first = threading.Thread(target=reload.check_once)
    first.start()
    assert store.entered.wait(30)
    second: list = []
    waiter = threading.Thread(target=lambda: second.append(reload.check_once()))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not applied  # not answered "unchanged" while the reload is half done
    store.release.set()
    first.join(30)
    waiter.join(30)
    assert second == [None] and [t.level for t in applied[0]] == ["L3"]


def test_sighup_reloads_the_descriptors_of_relay_serve(database_url, fake_github, tmp_path):
    backends = tmp_path / "sighup-backends"
    backends.mkdir()
    write_backend(backends, "l4", "org/l4-ci", "L4")
    env = {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "t", "RELAY_GITHUB_API_URL": fake_github.url,
           "RELAY_DATABASE_URL": database_url, "RELAY_BACKENDS_DIR": str(backends),
           "RELAY_DESCRIPTOR_CHECK_SECONDS": "0"}
    relay = RelayProcess(env, tmp_path / "relay.log").start()
    try:
        write_backend(backends, "l4", "org/l4-ci", "L3")
        relay.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while loopback_client().get(f"{relay.url}/api/backends/l4").json()["level"] != "L3":
            assert time.monotonic() < deadline, "SIGHUP did not reload the descriptors"
            time.sleep(0.05)
        assert relay.process.poll() is None  # SIGHUP reloads; it does not end the relay
    finally:
        relay.stop()


# A reload is a transaction: half-written files, files removed mid-checkout and symlinks out of the
# folder keep the allowlist in use and name the file, line and column, never a line's content.

def reload_of(store, folder):
    from relay.trust import load_allowlist
    targets = load_allowlist(folder)
    store.sync_backends(targets)
    applied: list = []
    return DescriptorReload(folder, store, applied.append, interval_seconds=0, active=targets), applied


def test_a_descriptor_cut_before_its_relay_section_keeps_the_backend(store, tmp_path):
    path = write_backend(tmp_path, "l4", "org/l4-ci", "L4")
    write_backend(tmp_path, "l2", "org/l2-ci", "L2")
    reload, applied = reload_of(store, tmp_path)
    path.write_text(path.read_text().split("relay:")[0])  # still valid YAML, a valid descriptor
    assert reload.check_once() is None and applied == []
    assert reload.last_error == (
        f"{path}: backend 'l4' is in the allowlist but its descriptor has no relay section (a file being written?); "
        "the allowlist in use is kept -> to take it out, write relay_retired: <why> in place of its relay section")
    assert [(b.name, b.active) for b in store.backends()] == [("l2", True), ("l4", True)]
    path.unlink()  # a checkout removing the file before writing it again
    assert reload.check_once() is None and "descriptor is missing" in reload.last_error
    path.write_text(path.parent.joinpath("l2.yaml").read_text().replace("l2", "l4").split("relay:")[0]
                    + "relay_retired: moved to another relay\n")
    assert reload.check_once() == {} and reload.last_error is None
    assert [t.name for t in applied[-1]] == ["l2"]
    assert [(b.name, b.active) for b in store.backends()] == [("l2", True), ("l4", False)]


def test_a_descriptor_cut_before_its_level_is_refused_not_a_level_change(store, tmp_path):
    path = write_backend(tmp_path, "l2", "org/l2-ci", "L2")
    full = path.read_text()
    reload, applied = reload_of(store, tmp_path)
    for _ in range(3):  # a writer caught mid-file, again and again: no level change recorded
        path.write_text(full.replace(", level: L2}", "}"))
        assert reload.check_once() is None
        assert "relay.level: Field required -> add 'relay.level' (line 6, column 8)" in reload.last_error
        path.write_text(full)
        assert reload.check_once() == {}
    assert [(b.name, b.level, b.level_changed_at) for b in store.backends()] == [("l2", "L2", None)]
    set_level(tmp_path, "l2", "L3")
    assert reload.check_once() == {"l2": ("L2", "L3")}
    assert reload.check_once() is None  # recorded once


def test_a_yaml_error_names_file_line_and_column_not_the_line(store, tmp_path):
    path = write_backend(tmp_path, "l4", "org/l4-ci", "L4")
    reload, _ = reload_of(store, tmp_path)
    path.write_text(path.read_text() + 'token: "BK-SECRET-555\n')
    assert reload.check_once() is None
    assert reload.last_error == (f"{path}: not valid YAML at line 8, column 1: found unexpected end of stream "
                                 "(the line itself is not shown)")
    assert "BK-SECRET" not in reload.last_error and "token" not in reload.last_error


def test_an_unknown_key_that_is_not_a_name_is_not_echoed(store, tmp_path):
    path = write_backend(tmp_path, "l4", "org/l4-ci", "L4")
    reload, _ = reload_of(store, tmp_path)
    path.write_text(path.read_text() + "root:x:0:0:root:/root:/bin/bash: 1\n")
    assert reload.check_once() is None
    assert "<a key>: Extra inputs are not permitted -> remove '<a key>'" in reload.last_error
    assert "(line 7, column 1)" in reload.last_error and "/bin/bash" not in reload.last_error


def test_a_symlink_out_of_the_descriptor_folder_is_refused(store, tmp_path):
    folder = tmp_path / "backends"
    folder.mkdir()
    write_backend(folder, "l4", "org/l4-ci", "L4")
    outside = write_backend(tmp_path, "l3", "org/l3-ci", "L3")
    reload, applied = reload_of(store, folder)
    (folder / "l3.yaml").symlink_to(outside)
    assert reload.check_once() is None and applied == []
    assert reload.last_error == (
        f"{folder / 'l3.yaml'}: a symlink to a file outside {folder}; refused -> put the descriptor itself in the folder")
    (folder / "l3.yaml").unlink()
    (folder / "l3.yaml").symlink_to(folder / "l4.yaml")  # inside the folder: read (and found misnamed)
    assert reload.check_once() is None and "name: 'l4' does not match the file name" in reload.last_error
