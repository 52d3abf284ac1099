"""Finding the processes a test started, by a tag in their environment (to prove none outlived it)."""

from __future__ import annotations

import os


def processes_tagged(tag: str) -> list[int]:
    """The pids of live processes whose environment holds ``CONFORMANCE_TEST_TAG=<tag>``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"CONFORMANCE_TEST_TAG={tag}".encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found
