"""CPU rank processes forked from one server that has imported torch, instead of fresh interpreters.

Importing torch costs a rank about 2 s of CPU; on a CPU backend the ranks share the few cores the run has,
and a pool started again after a crash pays it again for every rank. So a controller starts one server
(``main``, in a fresh interpreter) that imports torch and ``torch.distributed`` and forks a
rank for each request: the rank then sets up its environment, working directory, import path, thread
count and log as a fresh one would have them, and runs ``worker.run``.

Only for CPU ranks (``process.start_method``): an accelerator's runtime must never be inherited across a
fork, and an out-of-tree device's extension may start it as torch imports it.

Where the controller is fit to be copied (``fork_here``: Linux, torch imported, no other thread running Python,
no accelerator runtime started), the server is a fork of the controller instead, which saves the server's own
import of torch (about 2 s of CPU per run, and per launcher process under torchrun). That server first makes
itself what a fresh one would be: it forgets the modules the run imported (test modules, conftests, the suites;
each rank imports them afresh from disk, without pytest's assertion rewriting), and restores standard streams,
signal handlers, warnings and the root logger's handlers; the descriptors' setup modules are never imported in
the controller. Otherwise (an xdist worker, whose channel to its controller is a thread) it starts fresh.

A run whose selected tests need DTensor or Dynamo has the server import those too, once, before it forks
their ranks (``_import_for_ranks``, the modules of ``capabilities.RANK_IMPORTS``): each rank would otherwise
pay about a second of CPU for them, again on every respawn.

The server imports nothing of the controller and never touches a device. It dies with its controller
(``PR_SET_PDEATHSIG``), and its ranks die with it. Each rank's exit status comes back through a pipe
of its own, which the server writes when it reaps the rank: the controller reads it as it would a
child's (``ForkedRank.poll``/``wait``).

Wire: the controller sends one request at a time on a socket, ``(length, pickled request)`` with the
rank's channel and status pipe as ancillary file descriptors; the server answers with the rank's pid.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

# Not ``-m``: the package imports this module first, and runpy would then run a second copy of it.
_SERVER_MAIN = "import sys; from conformance.ranks.forkserver import main; sys.exit(main(sys.argv[1:]))"
_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!i")


class ForkedRank:
    """A rank forked by the server: the parts of ``subprocess.Popen`` the pool uses."""

    def __init__(self, pid: int, status_fd: int):
        self.pid = pid
        self._status_fd = status_fd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status_fd], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._status_fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout)
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        data = os.read(self._status_fd, _STATUS.size)
        # A server that died before reaping the rank (its ranks die with it): the rank was killed.
        self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else -signal.SIGKILL
        os.close(self._status_fd)


class ForkedServer:
    """A server forked from the controller: the parts of ``subprocess.Popen`` the controller uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone all the same
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank fork server {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkServer:
    """The controller's end: starts the server (``fork_here``, or fresh on first use) and asks it for ranks.

    ``server_main`` (Python source run with ``-c`` and the socket's descriptor as its argument) and ``cwd`` say
    how a fresh server starts: the project's tests start one of their own this way (tests/forked_commands.py)."""

    def __init__(self, server_main: str = _SERVER_MAIN, cwd: str | os.PathLike | None = None) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._server_main = server_main
        self._cwd = cwd

    def fork_rank(self, config: dict, channel_fd: int, log_path: str, env: dict[str, str],
                  imports: tuple[str, ...] = ()) -> ForkedRank:
        """A rank running ``worker.run(config)`` with ``channel_fd`` as its channel and its output in
        ``log_path``, in ``env`` (its PYTHONPATH leading the import path) and the current working directory;
        the server first imports what of ``imports`` it has not (``_import_for_ranks``)."""
        return self.fork({"config": config, "log_path": log_path, "env": env, "cwd": os.getcwd(),
                          "imports": list(imports)}, [channel_fd], env)

    def fork(self, request: dict[str, Any], fds: list[int], env: dict[str, str],
             child: type[ForkedRank] = ForkedRank) -> ForkedRank:
        """Send ``request`` with ``fds`` (the server closes its copies once it has forked) and a status pipe;
        the child's pid and that pipe's end come back as a ``child`` (``ForkedRank`` or a subclass). A server
        started now starts in ``env``."""
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        status_r, status_w = os.pipe()
        try:
            with self._lock:
                sock = self._running(env)
                socket.send_fds(sock, [_LENGTH.pack(len(data)) + data], [*fds, status_w])
                reply = _recv_exactly(sock, _STATUS.size)
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        if reply is None:
            os.close(status_r)
            raise RuntimeError(f"the fork server exited (exit code {self._server.wait(timeout=10)}); its "
                               "output went to the controller's stderr")
        return child(_STATUS.unpack(reply)[0], status_r)

    def fork_here(self) -> bool:
        """Start the server now as a fork of this process, if it is fit to be copied (``unfit_to_fork``);
        True when it did. Otherwise, or once that server is gone, a fresh one starts on first use."""
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                return False
            if unfit_to_fork() is not None:
                return False
            self.close()
            mine, theirs = socket.socketpair()
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                try:
                    stream.flush()  # or the server would write what is buffered here a second time
                except (AttributeError, OSError, ValueError):
                    pass
            with warnings.catch_warnings():
                # Python 3.12+ warns of any other thread; those left here are native libraries' (unfit_to_fork).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the server: never returns into the controller's code
                code = 1
                try:
                    mine.close()
                    _as_fresh_server(theirs.fileno())
                    code = main([str(theirs.fileno())])
                except BaseException:  # noqa: BLE001 - the server's output goes to the controller's stderr
                    traceback.print_exc()
                finally:
                    os._exit(code)
            theirs.close()
            self._server, self._sock = ForkedServer(pid), mine
            return True

    def _running(self, env: dict[str, str]) -> socket.socket:
        if self._server is not None and self._server.poll() is None:
            return self._sock
        self.close()
        mine, theirs = socket.socketpair()
        # The server's own environment is the first pool's (what torch reads as it imports); each rank then
        # sets its own.
        self._server = subprocess.Popen([sys.executable, "-c", self._server_main, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
                                        cwd=self._cwd)
        theirs.close()
        self._sock = mine
        return mine

    def close(self) -> None:
        """Stop the server (its ranks die with it) and wait for it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._server is not None:
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None


_SERVER = ForkServer()
atexit.register(_SERVER.close)  # so no server outlives the controller's exit, even for a moment


def fork_rank(config: dict, channel_fd: int, log_path: str, env: dict[str, str],
              imports: tuple[str, ...] = ()) -> ForkedRank:
    """A rank forked by this process's server (see ``ForkServer.fork_rank``)."""
    return _SERVER.fork_rank(config, channel_fd, log_path, env, imports)


def fork_here() -> bool:
    """Make this process's server a fork of this process, now (see ``ForkServer.fork_here``)."""
    return _SERVER.fork_here()


def unfit_to_fork() -> str | None:
    """Why this process must not be copied into a rank server, or None when it may: what a fork keeps of
    a thread is its memory, locks held included, and an accelerator's runtime never survives a fork."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if "torch" not in sys.modules:
        return "torch is not imported here (a fresh server imports it as cheaply)"
    # Every thread that runs Python, ``threading``'s or not (pytest-xdist's channel to its controller is
    # started with ``_thread``). The threads of native libraries are not counted: the server inherits
    # OpenBLAS's (numpy's, started as torch imports it) either way, and OpenBLAS stops them at a fork.
    python_threads = len(sys._current_frames())
    if python_threads != 1 or threading.current_thread() is not threading.main_thread():
        return f"{python_threads} Python threads run here"
    torch = sys.modules["torch"]
    for name in ("cuda", "xpu", "mtia"):
        module = getattr(torch, name, None)
        is_initialized = getattr(module, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            return f"torch.{name} is initialized here"
    return None


# What a server forked from its controller forgets (``_forget_the_runs_modules``) stays referenced here, so
# nothing of it is finalized in the server (a finalizer could close a file descriptor a rank has reused).
_FORGOTTEN: list[Any] = []


def _as_fresh_server(sock_fd: int) -> None:
    """In a server just forked from its controller: what a fresh ``python -c`` server would have."""
    # File descriptors: only the standard ones and the socket, as ``subprocess.Popen`` gives a fresh server.
    # The others are pointed at /dev/null rather than closed: the objects that own them stay, and must not
    # close a number a rank reuses.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in (sock_fd, devnull):
            try:
                os.dup2(devnull, fd)
            except OSError:  # the listing's own descriptor, closed by now
                pass
    sys.stdin = sys.__stdin__
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # the run may have put its capture there
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import faulthandler

    faulthandler.disable()  # each rank enables its own, writing to its log
    importlib.reload(warnings)  # the interpreter's filters, not a capture the run had open
    logging.root.handlers = [h for h in logging.root.handlers if not type(h).__module__.startswith("_pytest")]
    sys.meta_path[:] = [finder for finder in sys.meta_path if not type(finder).__module__.startswith("_pytest")]
    _forget_the_runs_modules()


def _forget_the_runs_modules() -> None:
    """Drop from ``sys.modules`` what the run imported that a fresh server would not have: every module
    from outside the standard library, site-packages and this package, and the suites (test modules,
    imported here under pytest's assertion rewriting). A rank imports them afresh, as it would."""
    here = Path(__file__)
    paths = sysconfig.get_paths()
    kept = {Path(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    kept |= {Path(p) for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages")}
    _FORGOTTEN.extend(forget_modules_outside(kept | {here.parents[1]}, inside_but_forgotten={here.parents[1] / "suites"}))


def forget_modules_outside(kept: set[Path], inside_but_forgotten: set[Path] = frozenset()) -> list[Any]:
    """Drop from ``sys.modules`` every module whose file is outside the folders ``kept`` or inside one of
    ``inside_but_forgotten``, symbolic links resolved; returns the modules dropped (keep them referenced, so
    that nothing of them is finalized).

    Each file is first compared, as a string, with the folders as written and as resolved; only a file under
    none of them is resolved and compared again: resolving each of the thousands of modules a process with
    torch holds took 0.15-0.2 s of CPU on every fork."""
    kept_resolved = {folder.resolve() for folder in kept}
    forgotten_resolved = {folder.resolve() for folder in inside_but_forgotten}

    def prefixes(folders: set[Path], resolved: set[Path]) -> tuple[str, ...]:
        return tuple(os.path.join(str(folder), "") for folder in resolved | {f for f in folders if f.is_absolute()})

    kept_prefixes = prefixes(kept, kept_resolved)
    forgotten_prefixes = prefixes(inside_but_forgotten, forgotten_resolved)
    dropped = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or not file:
            continue
        if file.startswith(forgotten_prefixes):
            forget = True
        elif file.startswith(kept_prefixes):
            forget = False
        else:
            path = Path(file).resolve()
            forget = (any(path.is_relative_to(folder) for folder in forgotten_resolved)
                      or not any(path.is_relative_to(folder) for folder in kept_resolved))
        if forget:
            dropped.append(sys.modules.pop(name))
    return dropped


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# -- the server ------------------------------------------------------------------------------------

def _serve(sock: socket.socket) -> None:
    serve_forks(sock, 1, lambda request, fds: _become_rank(request, fds[0]),
                before_fork=lambda request: _import_for_ranks(request.get("imports", ()), request["env"]))


def serve_forks(sock: socket.socket, fd_count: int, become, before_fork=None) -> None:
    """The server's loop: for each request (with ``fd_count`` descriptors and a status pipe), ``before_fork(request)``
    here, then a fork that runs ``become(request, fds)`` (it must never return) while this process answers the
    child's pid, closes its copies of the descriptors and, when it reaps the child, writes its exit status to the
    pipe. Returns when the controller closes the socket."""
    status_pipes: dict[int, int] = {}  # pid -> the write end of its status pipe
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD wakes the loop
    while True:
        readable = select.select([sock, wake_r], [], [])[0]
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(status_pipes)
        if sock in readable:
            received = _recv_exactly_with_fds(sock, fd_count + 1)
            if received is None:  # the controller is gone or done: so are we, and our children with us
                return
            request, (*fds, status_w) = received
            if before_fork is not None:
                before_fork(request)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                for fd in status_pipes.values():
                    os.close(fd)
                os.close(status_w)
                become(request, fds)  # never returns
            for fd in fds:
                os.close(fd)
            status_pipes[pid] = status_w
            sock.sendall(_STATUS.pack(pid))
            _reap(status_pipes)


def _recv_exactly_with_fds(sock: socket.socket, fd_count: int) -> tuple[dict, list[int]] | None:
    data, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, fd_count)
    if not data:
        return None
    rest = _recv_exactly(sock, _LENGTH.unpack(data)[0])
    if rest is None or len(fds) != fd_count:
        return None
    return pickle.loads(rest), fds


def _reap(status_pipes: dict[int, int]) -> None:
    while status_pipes:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_pipes.pop(pid, None)
        if fd is not None:
            os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _import_for_ranks(modules, env: dict[str, str]) -> None:
    """Import, here in the server, what of ``modules`` is not imported yet, so that every rank forked after
    inherits it instead of importing it itself (``capabilities.RANK_IMPORTS``: about a second of CPU per
    rank for DTensor and Dynamo). They import under the rank's environment and import path, as the rank
    would have (torch's config modules read environment variables as they load), like torch itself did
    under the first pool's. One that fails to import is left for the rank, which meets the same error."""
    missing = [name for name in modules if name not in sys.modules]
    if not missing:
        return
    saved_environ, saved_path = dict(os.environ), list(sys.path)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = list(dict.fromkeys([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + sys.path))
    try:
        for name in missing:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the rank imports it itself and reports what it raises
                pass
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
    gc.freeze()  # as ``main`` does for torch: what the ranks inherit stays out of their full collections


def _become_rank(request: dict[str, Any], channel_fd: int) -> None:
    """In the forked child: the setting a fresh ``python -m conformance.ranks.worker`` would have, then
    serve; exits with the worker's code (or 1 and the traceback in the log)."""
    code = 1
    try:
        log = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        # PYTHONPATH first, as a fresh interpreter has it (the pool puts the controller's import path there).
        search_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys(search_path + sys.path))
        import torch

        # OpenMP read OMP_NUM_THREADS when the server loaded it: give the rank its own setting.
        if env.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        from conformance.ranks import worker

        config = {**request["config"], "fd": channel_fd}
        sys.argv = [worker.__file__, json.dumps(config)]  # as ``python -m conformance.ranks.worker CONFIG`` has it
        code = worker.run(config)
    except BaseException:  # noqa: BLE001 - reported in the rank's log, as a fresh rank's would be
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(argv: list[str]) -> int:
    from conformance.ranks.worker import die_with_parent

    die_with_parent()
    import torch  # noqa: F401 - what every rank would import: the reason this server exists
    import torch.distributed  # noqa: F401

    # What the ranks inherit stays out of their garbage collector's full passes (which would walk every
    # torch object in each rank and copy the pages they touch): the pattern the gc module documents for
    # a process that forks without exec.
    gc.freeze()
    _serve(socket.socket(fileno=int(argv[0])))
    return 0
