"""Benchmark: the dispatcher's drain rate against outbox depth.

Fills the outbox of a fresh store with ``depth`` queued rows spread over ``backends`` backends (the
store's own intake path: deliveries with one outbox row per backend), then starts the real dispatcher
(claims, one lane per backend, github3 over HTTP to the fake GitHub on loopback, outcomes written back)
and times ``sends`` rows accepted by the fake after the first. It does that at a shallow depth (the baseline)
and a deep one in the same run, each repetition on a fresh database; the drain rate should not depend
on how many rows wait behind the ones being sent. ``--history`` adds that many ``sent`` rows before the
queued ones (a relay that has run for a while: the outbox keeps its sent rows).

    python bench/dispatch_drain.py [--shallow 200] [--deep 20000] [--sends 150] [--backends 50]
                                   [--history 0] [--database sqlite|postgresql://...] [--repeat 3]

Also prints the median time of a claim's search for due rows at each depth, measured alone before the
drain (a steadier sign than the rate on a loaded machine, where waits for SQLite's one writer dominate:
a search that walks the queue grows with it). Ends with one JSON line:
{"name", "figures", "ratio"}; ratio = deep rate / shallow rate (1.0: flat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from relay.dispatch.dispatcher import Dispatcher  # noqa: E402
from relay.github import GitHubClient  # noqa: E402
from relay.store import NewDelivery, NewDispatch, Store, create_scratch_database, drop_scratch_database  # noqa: E402
from relay.testing import FakeGitHub  # noqa: E402


def _fill(store: Store, rows: int, backends: int, tag: str) -> None:
    """``rows`` queued outbox rows, ``backends`` per delivery, stored through intake's group commit."""
    pending = []
    for index in range(0, rows, backends):
        delivery = f"{tag}-{index}-{uuid.uuid4().hex[:8]}"
        new = NewDelivery(delivery_id=delivery, event="push", action=None, repository="pytorch/pytorch",
                          outcome="dispatched", summary={}, body_sha256=uuid.uuid4().hex * 2)
        outbox = [NewDispatch(backend=f"b{b:02d}", repository=f"org/b{b:02d}-ci", event_type="push",
                              client_payload={"delivery": delivery, "event": "push", "repository": "pytorch/pytorch",
                                              "head": {"sha": "b" * 40, "ref": "refs/heads/main"}}, nonce=uuid.uuid4().hex)
                  for b in range(min(backends, rows - index))]
        pending.append(store.submit_delivery(new, outbox))
    for future in pending:
        assert future.result() is True


def _mark_sent(store: Store) -> None:
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE dispatches SET state = 'sent', sent_at = created_at"))


def _claim_search_ms(store: Store, repeat: int = 20) -> float:
    """Median time of a claim's search for due rows, alone (no dispatcher running, nothing claimed)."""
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        assert store.claim_dispatches("bench", limit=256, lease_seconds=60, max_claims=0) == []
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1000


def drain_once(fake: FakeGitHub, database: str, depth: int, sends: int, backends: int,
               history: int) -> tuple[float, float]:
    """Rows sent per second over ``sends`` of an outbox ``depth`` rows deep, and a claim search's ms."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'relay.db'}" if database == "sqlite" else _fresh_postgres(database)
        store = Store(url, deadline_seconds=60)
        store.migrate()
        if history:
            _fill(store, history, backends, "old")
            _mark_sent(store)
        _fill(store, depth, backends, "new")
        claim_ms = _claim_search_ms(store)
        dispatcher = Dispatcher(store, GitHubClient(fake.url, token="test-token", pool_size=backends),
                                requests_per_minute=0, poll_seconds=1.0, concurrency=backends)
        already = len(fake.dispatches())
        dispatcher.start()
        # Timed from the first accepted call, so start-up (threads, connections) is left out.
        while len(fake.dispatches()) == already:
            time.sleep(0.001)
        start = time.perf_counter()
        while len(fake.dispatches()) - already < sends + 1:
            time.sleep(0.001)
        elapsed = time.perf_counter() - start
        dispatcher.stop()
        store.close()
        return sends / elapsed, claim_ms


def _fresh_postgres(base_url: str) -> str:
    """A new database on the server of ``base_url`` (dropped at the end of the run)."""
    url = create_scratch_database(base_url, "bench_drain")
    _CREATED.append((base_url, url))
    return url


_CREATED: list[tuple[str, str]] = []


def _drop_created() -> None:
    for base_url, url in _CREATED:
        drop_scratch_database(base_url, url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shallow", type=int, default=200)
    parser.add_argument("--deep", type=int, default=20_000)
    parser.add_argument("--sends", type=int, default=150)
    parser.add_argument("--backends", type=int, default=50)
    parser.add_argument("--history", type=int, default=0, help="sent rows already in the outbox")
    parser.add_argument("--database", default="sqlite", help="sqlite, or a PostgreSQL URL to create databases on")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.sends >= args.shallow:
        parser.error("--sends must not exceed --shallow (the baseline would run dry)")
    rates: dict[str, list[float]] = {"shallow": [], "deep": []}
    claim_ms: dict[str, list[float]] = {"shallow": [], "deep": []}
    try:
        with FakeGitHub() as fake:
            for _ in range(args.repeat):  # interleaved, so drift in machine load hits both alike
                for name, depth in (("shallow", args.shallow), ("deep", args.deep)):
                    rate, claim = drain_once(fake, args.database, depth, args.sends, args.backends, args.history)
                    rates[name].append(rate)
                    claim_ms[name].append(claim)
    finally:
        _drop_created()
    shallow, deep = statistics.median(rates["shallow"]), statistics.median(rates["deep"])
    claim = {name: statistics.median(values) for name, values in claim_ms.items()}
    print(f"drain rate, first {args.sends} sends, {args.backends} backends, {args.history} sent rows before, "
          f"{args.database.split(':')[0]}:")
    for name, depth, rate in (("shallow", args.shallow, shallow), ("deep", args.deep, deep)):
        runs = ", ".join(f"{r:.1f}" for r in rates[name])
        print(f"  depth {depth:>6}: {rate:7.1f} rows/s (runs: {runs}); claim search {claim[name]:.1f} ms")
    print(f"  deep / shallow: {deep / shallow:.2f}")
    print(json.dumps({"name": "dispatch_drain", "figures": {
        "shallow_depth": args.shallow, "deep_depth": args.deep, "sends": args.sends, "backends": args.backends,
        "history": args.history, "database": args.database.split(":")[0],
        "shallow_rows_per_second": round(shallow, 2), "deep_rows_per_second": round(deep, 2),
        "shallow_claim_ms": round(claim["shallow"], 2), "deep_claim_ms": round(claim["deep"], 2)},
        "ratio": round(deep / shallow, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
