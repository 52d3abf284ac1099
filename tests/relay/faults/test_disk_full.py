"""A full disk under a SQLite store: webhooks and /readyz answer 503 (nothing is acknowledged that was
not stored), and both recover by themselves once space is freed."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from relay.testing import loopback_client
from tests.relay.helpers import push_payload


@pytest.fixture
def small_volume():
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder = Path(tempfile.mkdtemp(prefix="relay-full-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_gets_503_and_the_relay_recovers_once_space_is_freed(small_volume, relay_factory):
    relay = relay_factory(f"sqlite:///{small_volume / 'relay.db'}", store_deadline_seconds=2.0)
    assert relay.post("push", push_payload(after="1" * 40), delivery="before").status_code == 202
    filler = _fill(small_volume)
    answers = [relay.post("push", push_payload(after=f"{i + 3}" * 40), delivery=f"full-{i}").status_code for i in range(3)]
    health = loopback_client().get(f"{relay.url}/readyz", timeout=10)
    filler.unlink()
    # A write can still land in log pages the volume already holds (the log is reused after a
    # checkpoint): acknowledged, and stored; the others are refused, never acknowledged.
    assert 503 in answers and set(answers) <= {202, 503}, answers
    assert health.status_code in (200, 503)
    if health.status_code == 503:
        assert "cannot be written" in health.json()["detail"], health.text
    assert loopback_client().get(f"{relay.url}/readyz", timeout=10).status_code == 200
    for i, answer in enumerate(answers):
        assert (relay.store.delivery(f"full-{i}") is not None) == (answer == 202), (i, answer)
    refused = answers.index(503)
    assert relay.post("push", push_payload(after=f"{refused + 3}" * 40), delivery=f"full-{refused}").status_code == 202


def _fill_leaving(folder: Path, free_bytes: int) -> Path:
    """A file that takes the volume's space but ``free_bytes``."""
    filler = folder / "filler"
    stats = os.statvfs(folder)
    with open(filler, "wb", buffering=0) as out:
        remaining = stats.f_bavail * stats.f_frsize - free_bytes
        while remaining > 0:
            remaining -= out.write(b"\0" * min(65536, remaining))
    return filler


def test_on_a_nearly_full_volume_the_data_fills_it_not_the_log(small_volume, relay_factory):
    # Under a megabyte free: with SQLite's own checkpoint at 1000 pages (4 MB of log) the log filled the
    # volume after some 20 webhooks with the database file still empty (4 KB), and its checkpoint then
    # had no room to grow the database: every webhook after got 503 while the volume held almost no
    # data. Checkpointed every 64 pages, the log stays small and the webhooks' rows fill the volume.
    relay = relay_factory(f"sqlite:///{small_volume / 'relay.db'}", store_deadline_seconds=2.0)
    assert relay.post("push", push_payload(after="1" * 40), delivery="before").status_code == 202
    _fill_leaving(small_volume, 900_000)
    answers = []
    for i in range(300):
        answers.append(relay.post("push", push_payload(after=f"{i:040d}"), delivery=f"near-{i}").status_code)
        if answers[-1] == 503:
            break
    sizes = {f.name: f.stat().st_size for f in small_volume.iterdir()}
    accepted = answers.count(202)
    assert accepted >= 60, f"refused after {accepted} webhooks: {sizes}"
    assert sizes["relay.db-wal"] < 600_000 and sizes["relay.db"] > sizes["relay.db-wal"], sizes
    assert all(relay.store.delivery(f"near-{i}") is not None for i in range(accepted))
