"""A background thread that runs one pass of work every few seconds until the app stops.

Used by the sweeper and the re-run watcher: a pass that raises is logged and the next pass runs as
planned, so one bad row never stops the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["PeriodicThread"]

log = logging.getLogger("relay.periodic")


class PeriodicThread:
    """Calls ``work()`` every ``interval`` seconds on a daemon thread named ``name``."""

    def __init__(self, name: str, interval: float, work: Callable[[], object]):
        self.name = name
        self.interval = interval
        self.work = work
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.work()
            except Exception:
                log.exception("%s: pass failed; next pass in %.1f s", self.name, self.interval)
            self._stop.wait(self.interval)
