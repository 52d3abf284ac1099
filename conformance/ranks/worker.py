"""The code that runs inside one rank process (``python -m conformance.ranks.worker CONFIG``, or ``run``
in a process forked by ``conformance.ranks.forkserver``).

Started by ``conformance.ranks.process``; imports neither pytest nor the plugin. It imports the
descriptor's setup modules, joins the process group through the controller's TCPStore, then serves
``call`` messages until ``shutdown`` or until its socket closes. Results are moved to CPU before they
are sent, so the controller never has to touch an accelerator.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import importlib.util
import json
import os
import signal
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from conformance.ranks import protocol
from conformance.ranks.context import RankContext


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when the controller dies, so no rank outlives its session."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


_resolved: dict[tuple[str, str, str | None], Any] = {}  # functions found by earlier calls


def _resolve(module: str, qualname: str, path: str | None):
    """The function ``module``.``qualname`` (loading ``path`` if the module is not importable by name);
    kept after the first call, as every call of a test module's function finds the same object."""
    key = (module, qualname, path)
    if (found := _resolved.get(key)) is None:
        found = _resolved[key] = _find(module, qualname, path)
    return found


def _find(module: str, qualname: str, path: str | None):
    try:
        mod = importlib.import_module(module)  # also finds a module loaded by file on an earlier call
    except ModuleNotFoundError:
        if not path:
            raise
        # Test modules imported by pytest's rootdir logic are not on our sys.path: load by file.
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[module]  # as the import system does: the next call retries, not half a module
            raise
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if isinstance(value, (list, tuple)):
        converted = [_to_cpu(v) for v in value]
        return type(value)(converted) if not hasattr(value, "_fields") else type(value)(*converted)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _select_symmetric_memory_backend(name: str) -> str | None:
    """Select the symmetric-memory allocation backend before anything can allocate: torch refuses to
    change it after the first allocation ("Backend can not be changed after use"), and a test that
    allocates with the default one would otherwise decide it for every later test of the pool.
    Returns torch's error instead of raising: the rank still serves the tests that do not need it."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend(name)
    except Exception as exc:  # noqa: BLE001 - reported to the tests that need the backend
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


class Rank:
    def __init__(self, conn: Connection, config: dict):
        self.conn = conn
        self.config = config
        self.store = None
        self.ctx: RankContext | None = None

    def send(self, name: str, **kwargs: Any) -> None:
        protocol.send(self.conn, name, **kwargs)

    def start(self) -> None:
        import torch
        import torch.distributed as dist

        cfg = self.config
        for module in cfg["setup_modules"]:
            importlib.import_module(module)
        if cfg["device_type"] == "cpu":
            device = torch.device("cpu")
        else:
            # One rank per device (NCCL refuses two on one): a launcher's LOCAL_RANK, else the rank.
            count = torch.accelerator.device_count()
            device = torch.device(cfg["device_type"], cfg.get("device_index", cfg["rank"]) % max(count, 1))
            torch.accelerator.set_device_index(device.index)
        symm_backend, symm_error = cfg.get("symmetric_memory_backend"), None
        if symm_backend:
            symm_error = _select_symmetric_memory_backend(symm_backend)
        self.store = dist.TCPStore(cfg["store_host"], cfg["store_port"], is_master=False,
                                   timeout=timedelta(seconds=cfg["timeout"]))
        self.ctx = RankContext(rank=cfg["rank"], world_size=cfg["world_size"], device=device,
                               backend=cfg["backend"], descriptor=cfg["descriptor"],
                               shared_dir=cfg["shared_dir"], symmetric_memory_backend=symm_backend,
                               symmetric_memory_backend_error=symm_error, node=cfg.get("node", "local"))
        self.init_group(cfg["generation"])
        if cfg.get("default_device"):
            # After the process group is up (its set-up may allocate); see pool.DEFAULT_DEVICE_ENV.
            torch.set_default_device(cfg["default_device"])

    def describe_device(self) -> dict:
        """What the controller must not find out itself (it never touches a device): this rank's device
        name and the device-touching capability probes, run here with the rank's own settings; and the
        probes of what this rank has imported anyway (``config["probe"]``), which the controller need not."""
        import torch

        from conformance.capabilities import probes_on_rank

        device = self.ctx.device
        name = None
        if device.type != "cpu":
            try:
                name = torch.accelerator.get_device_name(device.index) if hasattr(torch.accelerator, "get_device_name") \
                    else torch.cuda.get_device_name(device.index)
            except Exception:  # noqa: BLE001 - a device without a name: reported as unknown
                name = None
        return {"device_name": name, "probes": probes_on_rank(device, self.ctx.backend, self.config.get("probe", ()))}

    def init_group(self, generation: int) -> None:
        import torch.distributed as dist

        cfg, ctx = self.config, self.ctx
        prefix = cfg.get("store_prefix", "")  # under a launcher its store is shared with other runs' keys
        if dist.is_initialized():
            dist.destroy_process_group()
        self._await_peers(f"{prefix}arrived/{generation}")
        kwargs = {}
        if ctx.device.type != "cpu":
            kwargs["device_id"] = ctx.device
        dist.init_process_group(
            backend=cfg["backend"], store=dist.PrefixStore(f"{prefix}group/{generation}", self.store),
            rank=ctx.rank, world_size=ctx.world_size,
            timeout=timedelta(seconds=cfg["timeout"]), **kwargs,
        )
        ctx.group = dist.group.WORLD

    def _await_peers(self, key: str) -> None:
        """Wait, for up to the start-up timeout, until every rank has come this far. Ranks start at different
        times (under a launcher each is another process's, on another host), and forming the group waits for
        its peers only as long as the call timeout, which a test may set to seconds."""
        cfg = self.config
        if self.store.add(key, 1) == cfg["world_size"]:
            self.store.set(f"{key}/all", b"1")
        self.store.wait([f"{key}/all"], timedelta(seconds=cfg["startup_timeout"]))

    def on_call(self, call: int, module: str, qualname: str, path: str | None, args: tuple, kwargs: dict) -> None:
        try:
            fn = _resolve(module, qualname, path)
            value = _to_cpu(fn(self.ctx, *args, **kwargs))
            self.send(protocol.RESULT, call=call, value=value)
        except BaseException as exc:  # report everything, including SystemExit from the function
            self.send(protocol.ERROR, call=call, exc_type=type(exc).__qualname__, message=str(exc),
                      traceback=traceback.format_exc())

    def on_reset_group(self, generation: int) -> None:
        try:
            self.init_group(generation)
            self.send(protocol.GROUP_READY, generation=generation)
        except BaseException:
            self.send(protocol.ERROR, exc_type="ResetFailed", message="process group reset failed",
                      traceback=traceback.format_exc())

    def serve(self) -> None:
        while True:
            try:
                name, kwargs = protocol.recv(self.conn)
            except (EOFError, OSError):
                return
            if name == protocol.SHUTDOWN:
                return
            handler = getattr(self, f"on_{name}", None)
            if handler is None:
                raise RuntimeError(f"rank {self.config['rank']}: unknown message {name!r}")
            handler(**kwargs)


def main(argv: list[str]) -> int:
    return run(json.loads(argv[0]))


def run(config: dict) -> int:
    """Be the rank ``config`` describes, its channel at file descriptor ``config["fd"]``, until shut down;
    the process's exit code."""
    die_with_parent()
    faulthandler.enable()  # a rank killed by a signal leaves its Python stack in its log (shown in RankCrashed)
    faulthandler.register(protocol.STACKS_SIGNAL, all_threads=True)  # a hung rank's, on request (RankTimeout)
    conn = Connection(config["fd"])
    rank = Rank(conn, config)
    try:
        rank.start()
    except BaseException:
        protocol.send(conn, protocol.INIT_FAILED, rank=config["rank"], traceback=traceback.format_exc())
        return 1
    rank.send(protocol.READY, rank=config["rank"], pid=os.getpid(), device=str(rank.ctx.device),
              **(rank.describe_device() if config["describe"] else {}))
    rank.serve()
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
