"""Benchmark: what a scratch PostgreSQL database costs the server, on its default disk against a tablespace.

The relay's tests make a database for each PostgreSQL test, a copy of one migrated template
(``tests/relay/migrated_databases.py``), and drop it after. This script makes ``--copies`` copies of a migrated
template and drops them, in the server's default tablespace and in ``--tablespace`` (``.ci/postgres`` makes
``relay_scratch`` on a RAM disk) in turn, ``--rounds`` times, and prints the wall time and the server's CPU per
copy (made and dropped) of each. The server's CPU is that of its process tree, read from /proc
(``bench/cpu_per_test.py``'s ``ProcessTree``), so the server must run on this machine (its processes readable:
run as root or as its user).

    python bench/scratch_databases.py [--admin-url postgresql://relay:relay@127.0.0.1:5432/postgres]
                                      [--tablespace relay_scratch] [--copies 40] [--rounds 3]

A file system where a new file costs much more after many deletions (ext4 without a journal looks for each new
inode past every one deleted in the last 30 s) shows it here as a default tablespace that gets dearer from round to
round. Ends with one JSON line {"name", "figures", "ratio"}; ratio = default's server CPU / the tablespace's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from bench.cpu_per_test import ProcessTree  # noqa: E402
from relay.store import create_scratch_database, drop_scratch_database  # noqa: E402
from relay.store.database import create_store_engine, normalise_url, run_migrations  # noqa: E402


def server_processes(admin_url: str) -> ProcessTree:
    """The server's processes: its postmaster (the parent of a session's backend) and every process below it,
    so another cluster on the machine does not count."""
    engine = create_engine(normalise_url(admin_url))
    try:
        with engine.connect() as connection:
            backend = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        return ProcessTree(psutil.Process(backend).ppid())
    finally:
        engine.dispose()


def one_round(admin_url: str, server: ProcessTree, template: str, copies: int) -> tuple[float, float]:
    """Wall and server CPU per copy made and dropped."""
    cpu, start = server.cpu_seconds(), time.perf_counter()
    made = [create_scratch_database(admin_url, "bench_copy", template=template) for _ in range(copies)]
    for url in made:
        drop_scratch_database(admin_url, url)
    return (time.perf_counter() - start) / copies, (server.cpu_seconds() - cpu) / copies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=os.environ.get("RELAY_TEST_POSTGRES_URL",
                                                              "postgresql://relay:relay@127.0.0.1:5432/postgres"))
    parser.add_argument("--tablespace", default="relay_scratch")
    parser.add_argument("--copies", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        server = server_processes(args.admin_url)
    except psutil.Error as exc:
        parser.error(f"the server's processes cannot be read ({exc}): it must run on this machine, readable by this "
                     "user")

    templates = {}
    for place, tablespace in (("default", None), ("scratch", args.tablespace)):
        templates[place] = create_scratch_database(args.admin_url, "bench_template", tablespace=tablespace)
        engine = create_store_engine(templates[place])
        run_migrations(engine)
        engine.dispose()  # a template with a session open cannot be copied
    figures: dict[str, dict[str, list[float]]] = {place: {"wall_ms": [], "server_cpu_ms": []} for place in templates}
    try:
        for round_number in range(1, args.rounds + 1):
            for place, template in templates.items():
                wall, cpu = one_round(args.admin_url, server, template, args.copies)
                figures[place]["wall_ms"].append(round(wall * 1000, 1))
                figures[place]["server_cpu_ms"].append(round(cpu * 1000, 1))
                print(f"round {round_number}, {place:7}: {wall * 1000:6.1f} ms wall, {cpu * 1000:6.1f} ms of the "
                      f"server's CPU per copy made and dropped ({args.copies} copies)")
    finally:
        for template in templates.values():
            drop_scratch_database(args.admin_url, template)
    medians = {place: statistics.median(values["server_cpu_ms"]) for place, values in figures.items()}
    print(f"median server CPU per copy: default {medians['default']:.1f} ms, {args.tablespace} "
          f"{medians['scratch']:.1f} ms")
    print(json.dumps({"name": "scratch_databases", "figures": {"copies": args.copies, "tablespace": args.tablespace,
                                                               **figures},
                      "ratio": round(medians["default"] / medians["scratch"], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
