"""Descriptor reload: the allowlist read again while the relay runs, and what a level change means.

Triggered by SIGHUP to ``relay serve`` (``request()``, from the signal handler) and every
``RELAY_DESCRIPTOR_CHECK_SECONDS`` (0: SIGHUP only) by its own thread, which reloads when the content
of the descriptor files (``*.yaml`` in ``RELAY_BACKENDS_DIR``) changed. Reads those files; writes the
backends table (``Store.sync_backends``: a changed level moves that backend's level version on, so
reporting re-decides the runs at open PRs' heads, see :mod:`relay.results.reporter`) and ends the level hold of
a backend whose level changed (a person decided its level). Hands the new targets to the running parts
(``apply``: intake routing, callback authentication, reporting, re-runs, the level watch, the dashboard)
and wakes reporting.

A reload is a transaction: it takes effect only when every file loads and every backend of the
allowlist in use is still in it or its descriptor says why it left (``relay_retired``). Otherwise (bad
YAML, a missing field, two backends on one repository, a symlink out of the folder, an active backend's
file cut before its relay section or removed mid-checkout) the loader's message, which names file,
line and column but never a line's content, is logged and kept in ``last_error``, and nothing changes:
the relay keeps the allowlist it has, and tries again when the files change or on the next SIGHUP.
A level is required in each relay section, so a file cut short never reads as a level change.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from conformance.descriptors import DescriptorError

from relay.periodic import PeriodicThread
from relay.trust import BackendTarget, descriptor_paths, load_allowlist

__all__ = ["DescriptorReload"]

log = logging.getLogger("relay.descriptor_reload")

Apply = Callable[[tuple[BackendTarget, ...]], None]


def content_digest(backends_dir: Path) -> str:
    """A digest of every descriptor's name and bytes (what a reload would read)."""
    digest = hashlib.sha256()
    try:
        paths = descriptor_paths(backends_dir)
    except DescriptorError as exc:  # the reload reports it; here it only makes the content differ
        return hashlib.sha256(str(exc).encode()).hexdigest()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError as exc:  # a file being replaced: the next check sees the new one
            digest.update(f"unreadable: {exc}".encode())
        digest.update(b"\0")
    return digest.hexdigest()


class DescriptorReload:
    """DescriptorReload(backends_dir, store, apply, interval_seconds=, on_level_changed=): see the module."""

    def __init__(self, backends_dir: Path, store, apply: Apply, *, interval_seconds: float,
                 on_level_changed: Callable[[], None] | None = None, active: Sequence[BackendTarget] = ()):
        self.backends_dir = backends_dir
        self.active = frozenset(t.name for t in active)  # the allowlist in use: none of it leaves silently
        self.store = store
        self.apply = apply
        self.on_level_changed = on_level_changed
        self.last_error: str | None = None
        self._digest = content_digest(backends_dir)
        self._forced = False
        self._checking = threading.Lock()  # the thread's pass and a direct call must not interleave
        self._thread = PeriodicThread("relay-descriptor-reload", interval_seconds, self.check_once)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def request(self) -> None:
        """Reload now, whether or not the files changed (SIGHUP; safe in a signal handler)."""
        self._forced = True
        self._thread.wake()

    def record(self, targets: Sequence[BackendTarget]) -> dict[str, tuple[str, str]]:
        """Sync ``targets`` into the store; a backend whose level changed has its level hold ended.
        Returns {backend: (old level, new level)}."""
        changed = self.store.sync_backends(targets)
        for name, (old, new) in changed.items():
            if self.store.end_level_hold(name, f"level changed: {old} -> {new}") is not None:
                log.info("level hold ended by a level change", extra={"backend": name, "from": old, "to": new})
        return changed

    def check_once(self) -> dict[str, tuple[str, str]] | None:
        """Reload if the files changed (or a reload was requested): the level changes it made, or None
        when nothing was reloaded (unchanged, or the descriptors do not load)."""
        with self._checking:
            return self._check_locked()

    def _check_locked(self) -> dict[str, tuple[str, str]] | None:
        forced, self._forced = self._forced, False
        digest = content_digest(self.backends_dir)
        if digest == self._digest and not forced:
            return None
        self._digest = digest  # a bad version is reported once, not at every check
        try:
            targets = load_allowlist(self.backends_dir, active=self.active)
        except DescriptorError as exc:
            self.last_error = str(exc)
            log.error("descriptors not reloaded; keeping the allowlist in use", extra={"error": str(exc)})
            return None
        changed = self.record(targets)
        self.apply(targets)
        left = sorted(self.active - {t.name for t in targets})
        self.active = frozenset(t.name for t in targets)
        self.last_error = None
        log.info("descriptors reloaded", extra={"backends": [t.name for t in targets], "retired": left,
                                                 "level_changes": {n: f"{a} -> {b}" for n, (a, b) in changed.items()}})
        if changed and self.on_level_changed is not None:
            self.on_level_changed()
        return changed
