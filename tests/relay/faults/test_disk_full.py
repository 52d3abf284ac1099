"""A full disk under a SQLite store: webhooks and /readyz answer 503 (nothing is acknowledged that was
not stored), and both recover by themselves once space is freed."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

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
    health = httpx.get(f"{relay.url}/readyz", timeout=10)
    filler.unlink()
    assert set(answers) == {503}, answers
    assert health.status_code == 503 and "cannot be written" in health.json()["detail"], health.text
    assert httpx.get(f"{relay.url}/readyz", timeout=10).status_code == 200
    assert relay.post("push", push_payload(after="9" * 40), delivery="full-0").status_code == 202
