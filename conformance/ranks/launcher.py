"""Runs under a launcher (``torchrun``, or SLURM through it): each launcher process is one rank.

The launcher has already chosen the world: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``
(the node) and ``MASTER_ADDR``/``MASTER_PORT`` (its TCPStore). Every launcher process runs the same
pytest session and is the controller of exactly one rank process (``python -m conformance.ranks.worker``,
global rank ``RANK``, device ``LOCAL_RANK``), so a hung or crashed rank is still killed and replaced by
its own controller, as in a local pool.

The controllers agree on every call's outcome through the launcher's store: each publishes its own
rank's reply under ``<prefix>x/<n>/<rank>`` and reads everyone's, so every controller sees the same
per-rank results and takes the same recovery step (fresh group, respawn) with the same generation.
A controller that never publishes (its process is gone) ends the call with ``RankCrashed``, and the
pool is then ``lost``: no later call can form the world again without relaunching.

The run ends with one more exchange (``RunEnd``): every controller publishes its verdicts, rank 0
gathers them, writes the report and publishes the run's exit code, and the others wait for that code
before they exit. torchrun tears down every local worker as soon as one exits non-zero, so a rank
that left first would kill rank 0 mid-report; waiting, then exiting 0, leaves the run's exit code to
rank 0, which carries every rank's outcome. Rank 0 itself leaves only once the ranks on its host have
exited, for the same reason.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from multiprocessing.connection import wait

from conformance.ranks import protocol
from conformance.ranks.pool import RankCrashed, RankError, RankPool
from conformance.ranks.process import RankProcess

__all__ = ["LauncherPool", "LauncherWorld", "RunEnd", "WorldLost", "peer_margin"]

# How long a controller waits for its peers' answers beyond its own deadline: they may have started
# the call a little later, and a peer whose rank is stuck reports only at its own deadline.
PEER_MARGIN = 30.0
# How long rank 0 waits for the others to read the run's exit code before it exits itself.
ACK_TIMEOUT = 30.0


def peer_margin(timeout: float) -> float:
    """``PEER_MARGIN``, or the call's own timeout when that is shorter (a run with short calls has
    short gaps between them too)."""
    return min(PEER_MARGIN, timeout)


class WorldLost(RankCrashed):
    """The launcher's world cannot be formed again in this run (a launcher process is gone)."""


@dataclass(frozen=True)
class LauncherWorld:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    agent_store: bool

    @classmethod
    def from_env(cls, env=None) -> "LauncherWorld | None":
        """The world a launcher set up, or None when this process was not started by one."""
        env = os.environ if env is None else env
        needed = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        if not all(env.get(k) for k in needed):
            return None
        try:
            return cls(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), local_rank=int(env["LOCAL_RANK"]),
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE") or 1),
                       node_rank=int(env.get("GROUP_RANK") or 0), master_addr=env["MASTER_ADDR"],
                       master_port=int(env["MASTER_PORT"]), run_id=env.get("TORCHELASTIC_RUN_ID") or "none",
                       agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
        except ValueError as exc:
            raise ValueError(f"launcher environment is malformed ({exc}); check RANK, WORLD_SIZE, LOCAL_RANK, "
                             "GROUP_RANK and MASTER_PORT") from None

    @property
    def run_key(self) -> str:
        """Names this launch (a static rendezvous has no run id of its own: ``none``)."""
        return f"{self.run_id}-{self.master_addr}-{self.master_port}"

    @property
    def node(self) -> str:
        return f"node {self.node_rank} ({socket.gethostname()})"

    def connect_store(self, timeout: float):
        """The launcher's TCPStore (torchrun's agent hosts it); without an agent, rank 0 hosts it."""
        import torch.distributed as dist

        return dist.TCPStore(self.master_addr, self.master_port, is_master=self.rank == 0 and not self.agent_store,
                             wait_for_workers=False, timeout=timedelta(seconds=timeout))


class LauncherPool(RankPool):
    """A ``RankPool`` whose world is the launcher's: this process controls rank ``world.rank`` only."""

    def __init__(self, *, world: LauncherWorld, shared_root: str | None = None, **kwargs):
        # Started as any pool's ranks are (``default_start_method``): on CPU forked from a server that is a
        # copy of this launcher process (``forkserver.fork_here``), so no start imports torch again.
        super().__init__(world_size=world.world_size, **kwargs)
        self.world = world
        self.prefix = f"conformance/{world.run_key}/"
        # ``shared_root`` (--shared-dir) is a directory every node mounts; without it, one per node (a
        # launcher's nodes share no file system in general).
        self.shared_by_all = shared_root is not None
        root = Path(shared_root) if shared_root is not None else Path(tempfile.gettempdir())
        self.shared_dir = root / f"conformance-{world.run_key}" / "shared"
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        self._ctl_store = None
        self._exchanges = 0
        self._calls = 0
        self.lost: str | None = None

    def _label(self) -> str:
        return f"{self.descriptor} launcher world ({self.world_size} ranks, {self.backend}, {self.world.node})"

    def start(self) -> None:
        if self.lost:
            raise WorldLost(self.lost)
        super().start()

    def _spawn(self) -> None:
        self._store()
        self.generation += 1
        self.spawns += 1
        world = self.world
        config = self._rank_config(world.rank, world_size=world.world_size, store_host=world.master_addr,
                                   store_port=world.master_port, store_prefix=self.prefix,
                                   device_index=world.local_rank, node=world.node)
        env = self._rank_env(world.local_world_size)
        self.ranks = [RankProcess.spawn(world.rank, config, self.workdir / f"rank{world.rank}.log", env,
                                        self.start_method, self.rank_imports)]

    def run_with_timeout(self, timeout, fn, *args, **kwargs):
        """Rank 0's call is the world's: the other controllers check that they reached the same function
        and run it with rank 0's arguments (a test drawing a random argument draws it once)."""
        if self.lost:
            raise WorldLost(self.lost)
        store = self._store()
        self._calls += 1
        key = f"{self.prefix}call/{self._calls}"
        if self.world.rank == 0:
            store.set(key, pickle.dumps((fn.__qualname__, args, kwargs)))
        else:
            # Polled, not store.wait: a blocking wait would hold off the launcher's SIGTERM until it times out.
            if not _poll(store, key, timeout + peer_margin(timeout)):
                self.lost = (f"{self._label()}: rank 0 did not make call {self._calls} ({fn.__qualname__}) "
                             f"within {timeout + peer_margin(timeout):g} s; the world cannot be formed again without relaunching")
                self._teardown(self.lost)
                raise WorldLost(self.lost)
            qualname, args, kwargs = pickle.loads(store.get(key))
            if qualname != fn.__qualname__:
                raise RankError(f"{self._label()}: the controllers diverged at call {self._calls}: rank 0 runs "
                                f"{qualname}, rank {self.world.rank} {fn.__qualname__} (a test must make the same "
                                "ranks.run calls on every launcher process)")
        return super().run_with_timeout(timeout, fn, *args, **kwargs)

    def _store(self):
        if self._ctl_store is None:
            self._ctl_store = self.world.connect_store(self.startup_timeout)
        return self._ctl_store

    def close(self) -> None:
        super().close()
        if (self.world.rank if self.shared_by_all else self.world.local_rank) == 0:
            shutil.rmtree(self.shared_dir.parent, ignore_errors=True)

    # -- agreeing on an outcome ------------------------------------------------------------------------
    def _key(self, n: int, rank: int) -> str:
        return f"{self.prefix}x/{n}/{rank}"

    def _collect(self, wanted, timeout, *, grace=None, call=None):
        """Everyone's replies: this rank's (watched locally, as ``RankPool._collect`` does, but giving up
        ``grace`` s after a peer reported an error) and every peer's, read from the store."""
        self._exchanges += 1
        n, me, store = self._exchanges, self.world.rank, self._store()
        deadline = time.monotonic() + timeout
        peers = [r for r in range(self.world_size) if r != me]
        seen_peer_failure = False
        mine = None
        proc = self.ranks[0] if self.ranks else None
        while mine is None and proc is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if wait([proc.conn], timeout=min(remaining, 0.2)):
                try:
                    name, body = protocol.recv_or_unreadable(proc.conn)
                except (EOFError, OSError):
                    try:
                        proc.wait(timeout=10)
                    except Exception:  # noqa: BLE001 - described below either way
                        pass
                    mine = (protocol.RANK_GONE, {"message": proc.death_description(f" on {self.world.node}"),
                                                 "traceback": proc.last_output()})
                    break
                if name in wanted and not self._late(me, name, body, wanted, call):
                    mine = (name, body)
                continue
            if grace is not None and not seen_peer_failure:
                for peer in peers:
                    key = self._key(n, peer)
                    if store.check([key]) and pickle.loads(store.get(key))[0] in (protocol.ERROR, protocol.RANK_GONE):
                        seen_peer_failure = True
                        deadline = min(deadline, time.monotonic() + grace)
                        break
        store.set(self._key(n, me), pickle.dumps(mine if mine is not None else (None, {})))
        replies = {me: mine} if mine is not None else {}
        margin = peer_margin(timeout)
        peer_deadline = time.monotonic() + max(deadline - time.monotonic(), 0) + (grace or 0) + margin
        pending = list(peers)
        while pending and time.monotonic() < peer_deadline:
            for peer in list(pending):
                key = self._key(n, peer)
                if store.check([key]):
                    pending.remove(peer)
                    reply = pickle.loads(store.get(key))
                    if reply[0] is not None:
                        replies[peer] = reply
            if pending:
                time.sleep(0.02)
        if pending:
            # Which exchange, and how far the first silent peer got: launcher processes that disagree on the
            # number of exchanges (one started a pool the other did not) wait for each other's keys in vain.
            self.lost = (f"{self._label()}: the launcher process of rank {', '.join(map(str, pending))} did not report "
                         f"within {timeout + (grace or 0) + margin:g} s at exchange {n} (waiting for "
                         f"{' or '.join(sorted(wanted))}; {self._progress_of(pending[0], n)}); the world cannot be "
                         "formed again without relaunching")
            self._teardown(self.lost)
            raise WorldLost(self.lost)
        return replies

    def _progress_of(self, peer: int, n: int, span: int = 5) -> str:
        """Where ``peer``'s replies in the store stop, within ``span`` exchanges of exchange ``n``, in words."""
        try:
            store = self._store()
            last = next((k for k in range(n + span, max(n - span, 0), -1) if store.check([self._key(k, peer)])), None)
        except Exception:  # noqa: BLE001 - the store has gone with its host
            return f"the store of rank {peer}'s replies is gone"
        if last is None:
            return f"rank {peer} left no reply in the store within {span} exchanges of this one"
        return f"rank {peer}'s last reply in the store is at exchange {last}"



def _poll(store, key: str, timeout: float) -> bool:
    """Whether ``key`` appeared in ``store`` within ``timeout`` s (False as well when the store is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if store.check([key]):
                return True
        except Exception:  # noqa: BLE001 - the store has gone with its host
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _still_running(pid: int) -> bool:
    """Whether process ``pid`` has not exited (a zombie, exited and not yet reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:  # no /proc (not Linux): a zombie counts as running until its parent reaps it
        return True


class RunEnd:
    """The launcher world's last exchange (see the module docstring), through the launcher's store.

    ``publish`` (every rank), then on rank 0 ``gather`` and ``announce``, elsewhere ``await_code``.
    A rank whose store has gone (its launcher ended the run) counts as one that did not answer.
    """

    def __init__(self, world: LauncherWorld, store):
        self.world = world
        self.store = store
        self.prefix = f"conformance/{world.run_key}/end/"

    def publish(self, payload: dict) -> None:
        self.store.set(f"{self.prefix}result/{self.world.rank}", json.dumps(payload))

    def gather(self, timeout: float) -> tuple[dict[int, dict], list[int]]:
        """Rank 0: ({rank: payload} of every rank that published within ``timeout`` s, [ranks that did not])."""
        keys = {rank: f"{self.prefix}result/{rank}" for rank in range(1, self.world.world_size)}
        found = self._wait_for(keys, timeout)
        return {rank: json.loads(value) for rank, value in found.items()}, [r for r in keys if r not in found]

    def announce(self, code: int, ranks: list[int], timeout: float = ACK_TIMEOUT) -> list[int]:
        """Rank 0: publish the run's exit code, wait until ``ranks`` have read it and those on this host have
        exited; the ranks that did not read it. torchrun stops a node's other processes once one exits
        non-zero: a rank still on its way out when rank 0 leaves would die of that SIGTERM, a failure."""
        deadline = time.monotonic() + timeout
        self.store.set(f"{self.prefix}code", str(code))
        keys = {rank: f"{self.prefix}ack/{rank}" for rank in ranks}
        acks = self._wait_for(keys, timeout)
        here = socket.gethostname()
        local = [int(pid) for host, _, pid in (ack.decode().partition(" ") for ack in acks.values())
                 if host == here and pid.isdigit()]
        while any(_still_running(pid) for pid in local) and time.monotonic() < deadline:
            time.sleep(0.02)
        return [r for r in keys if r not in acks]

    def await_code(self, timeout: float) -> int | None:
        """Not rank 0: rank 0's exit code once it has written the report, or None if it never came."""
        found = self._wait_for({0: f"{self.prefix}code"}, timeout)
        if not found:
            return None
        try:
            self.store.set(f"{self.prefix}ack/{self.world.rank}", f"{socket.gethostname()} {os.getpid()}")
        except Exception:  # noqa: BLE001 - rank 0 has gone already: nothing left to tell it
            pass
        return int(found[0])

    def _wait_for(self, keys: dict[int, str], timeout: float) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        deadline = time.monotonic() + timeout
        for rank, key in keys.items():
            if _poll(self.store, key, max(deadline - time.monotonic(), 0.0)):
                try:
                    found[rank] = self.store.get(key)
                except Exception:  # noqa: BLE001 - the store has gone with its host
                    break
        return found
