"""The ``pytest`` and ``conformance`` commands the project's tests run, forked from a server that has imported
torch, instead of fresh interpreters that each import it.

The tests run dozens of these commands (pytester's subprocess runs, ``conformance run``/``list``/``backends``);
each fresh one spends about 2 s of CPU importing torch before it does anything the test looks at. So a test
process (an xdist worker) starts one server (``main``, a fresh interpreter) that imports ``torch`` and
``torch.distributed`` and forks a child per command. The child makes itself what the fresh command would be:
its standard streams, environment, working directory and import path (``PYTHONPATH`` first, then the
interpreter's own, not the server's), no module of the project or the tests imported, Python's signal
handlers, except that what the test process ignores stays ignored (as across an exec); then it runs the
module (``python -m pytest``) or the console script (``conformance``) as ``__main__`` and exits with its code,
after joining its threads and running its exit handlers, as the interpreter does.

A command is run fresh instead (``popen(..., fresh=True)``, or by itself) when the fork could not be what a
fresh interpreter is: an environment that differs from the server's in a variable torch or Python read as
they started (``_READ_AT_START``), or that tags the processes for a test to find them by
``/proc/<pid>/environ`` (a fork's is the server's), an argv that is not this environment's Python with ``-m``
or one of its console scripts, a platform without ``fork``. Tests that exist to prove a fresh process (one
that must not import torch, say) ask for one.

The fork machinery is the rank fork server's (``conformance.ranks.forkserver``: ``ForkServer`` started with this
module's ``main``, whose loop is ``serve_forks``): each child's exit status comes back through a pipe the
server writes when it reaps it.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from conformance.ranks.forkserver import ForkedRank, ForkServer, forget_modules_outside, serve_forks

__all__ = ["ForkedCommand", "popen", "run"]

# Not ``-m``: runpy would import this module twice (as ``__main__`` and by name).
_SERVER_MAIN = "import sys; from tests.forked_commands import main; sys.exit(main(int(sys.argv[1])))"
_CHECKOUT = Path(__file__).resolve().parents[1]
# What torch, OpenMP and the interpreter read from the environment as they start (so the server's values
# hold in every child): a command whose environment differs in one of these runs fresh.
_READ_AT_START = ("TORCH", "PYTORCH", "CUDA", "HIP", "ROCM", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_",
                  "PYTHON", "MALLOC_")
# A test finds the processes a command left by this variable in ``/proc/<pid>/environ``, which in a fork is
# the server's (tests/conformance/tagged_processes.py).
_FOUND_BY_ENVIRON = "CONFORMANCE_TEST_TAG"


class ForkedCommand(ForkedRank):
    """A command forked by the server: the parts of ``subprocess.Popen`` the tests and pytester use."""

    stdin = stdout = stderr = None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not once reaped: the pid may be another process's by then
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike, stdout: int, stderr: int,
          fresh: bool = False) -> ForkedCommand | subprocess.Popen:
    """Start ``argv`` (``python -m <module> ...`` or an installed console script) in ``cwd`` with ``env`` as
    its whole environment, standard input empty and ``stdout``/``stderr`` (file descriptors) as its
    output: forked from the server, or fresh (``fresh``, or when a fork could not be faithful)."""
    target = None if fresh else _target(argv)
    if target is None or _differs_at_start(env) or not hasattr(os, "fork"):
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    # A signal ignored here stays ignored in a fresh command (exec keeps SIG_IGN; Python then leaves SIGINT alone).
    ignored = [int(sig) for sig in signal.valid_signals() if signal.getsignal(sig) == signal.SIG_IGN]
    return _SERVER.fork({"target": target, "argv": list(argv), "env": dict(env), "cwd": os.fspath(cwd),
                         "ignored_signals": ignored}, [stdout, stderr])


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike, timeout: float,
        fresh: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)``, through ``popen``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = popen(argv, env=dict(os.environ) if env is None else env, cwd=cwd, stdout=out.fileno(),
                        stderr=err.fileno(), fresh=fresh)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, code, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


def _target(argv: list[str]) -> tuple[str, str] | None:
    """("module", name) for ``python -m name``/``python -mname``, ("path", script) for a console script of
    this interpreter; None for anything else (another environment's Python or script included)."""
    if not argv:
        return None
    if _is_this_python(argv[0]):
        if len(argv) >= 3 and argv[1] == "-m":
            return ("module", argv[2])
        if len(argv) >= 2 and argv[1].startswith("-m") and len(argv[1]) > 2:
            return ("module", argv[1][2:])
        return None
    try:
        with open(argv[0], "rb") as script:
            first_line = script.readline()
    except OSError:
        return None
    if first_line.startswith(b"#!") and _is_this_python(first_line[2:].strip().decode(errors="replace")):
        return ("path", os.path.abspath(argv[0]))
    return None


def _is_this_python(path: str) -> bool:
    """The same interpreter in the same environment: every virtual environment's ``python`` links to one."""
    return (os.path.dirname(os.path.abspath(path)) == os.path.dirname(os.path.abspath(sys.executable))
            and os.path.realpath(path) == os.path.realpath(sys.executable))


def _differs_at_start(env: dict[str, str]) -> bool:
    if _FOUND_BY_ENVIRON in env:
        return True
    server_env = _SERVER.environment()
    for key in set(env) | set(server_env):
        if key != "PYTHONPATH" and key.startswith(_READ_AT_START) and env.get(key) != server_env.get(key):
            return True
    return False


class _Server:
    """The test process's end: the server, started on first use in the environment of that first command."""

    def __init__(self) -> None:
        self._forks = ForkServer(_SERVER_MAIN, cwd=_CHECKOUT)
        self._environment: dict[str, str] | None = None

    def environment(self) -> dict[str, str]:
        """The environment the server imports torch under: this process's at the first command (after the run's
        configuration, which sets some), without PYTHONPATH (each command's own leads its import path)."""
        if self._environment is None:
            self._environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return self._environment

    def fork(self, request: dict[str, Any], fds: list[int]) -> ForkedCommand:
        return self._forks.fork(request, fds, self.environment(), child=ForkedCommand)

    def close(self) -> None:
        self._forks.close()  # the server ends when its socket does


_SERVER = _Server()
atexit.register(_SERVER.close)


# -- the server ------------------------------------------------------------------------------------

def main(sock_fd: int) -> int:
    # The interpreter's own import path, as a fresh command has it after its script's directory and its
    # PYTHONPATH (the server has none: ``_Server.environment``); without the -c entry ('').
    base_path = sys.path[1:]
    from conformance.ranks.worker import die_with_parent

    die_with_parent()
    import gc

    import torch  # noqa: F401 - what every command imports: the reason this server exists
    import torch.distributed  # noqa: F401

    gc.freeze()  # as the rank server does: what the children inherit stays out of their full collections
    serve_forks(socket.socket(fileno=sock_fd), 2,
                lambda request, fds: _become_command(request, fds[0], fds[1], base_path))
    return 0


def _become_command(request: dict[str, Any], stdout: int, stderr: int, base_path: list[str]) -> None:
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for sig in request["ignored_signals"]:
            signal.signal(sig, signal.SIG_IGN)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        kind, name = request["target"]
        first = os.getcwd() if kind == "module" else os.path.dirname(os.path.realpath(name))
        search_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [first, *search_path, *base_path]
        _forget_modules_outside_the_interpreter()
        if kind == "module":
            sys.argv = ["-m", *request["argv"][3 if request["argv"][1] == "-m" else 2:]]
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [name, *request["argv"][1:]]
            runpy.run_path(name, run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # what the interpreter does as it exits: join the threads that are not daemons,
            atexit._run_exitfuncs()  # then run the exit handlers
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _forget_modules_outside_the_interpreter() -> None:
    """Drop the modules a fresh interpreter would not have: the server's own (this module, the project's),
    anything not from the standard library or site-packages. The command imports them afresh."""
    paths = sysconfig.get_paths()
    kept = {Path(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    _FORGOTTEN.extend(forget_modules_outside(kept))


_FORGOTTEN: list[Any] = []  # kept referenced, so that nothing of them is finalized in the child
