"""Run as ``python -m tests.command_probe [exit code]`` by tests/test_forked_commands.py: prints, as JSON, what a
command sees of its process, then exits with the code given."""

import atexit
import json
import os
import signal
import sys
import threading
import time

preloaded = "torch" in sys.modules  # before anything here imports it: a fork of the server has it
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "marker": os.environ.get("CONFORMANCE_TEST_MARKER"),
    "project_modules": sorted(name for name in sys.modules if name.split(".")[0] in ("tests", "conformance", "relay")
                              and name not in ("tests", "tests.command_probe")),
    "main": __name__, "stdin": sys.stdin.read(), "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "preloaded": preloaded,
    "parent": os.getppid()}))
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("exit handlers ran"))
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise RuntimeError("raised at the top level")
if len(sys.argv) > 1 and sys.argv[1] == "thread":  # the interpreter waits for it before the exit handlers
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread ended", flush=True))).start()
    sys.exit(0)
if len(sys.argv) > 1 and sys.argv[1] == "hang":
    signal.pause()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
