"""Point-to-point messages over the backend's process group: send/recv between every ordered pair of
ranks (pairs that do not involve rank 0 need 3 or more ranks: the 4-rank test), every dtype bit for
bit, isend/irecv with tags posted out of order and many messages in flight, and batch_isend_irecv.

Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import min_ranks, requires, world_size
from conformance.suites import _collective_bodies as bodies
from conformance.suites import _collective_data as data
from conformance.suites.test_collectives import raise_problems

pytestmark = [requires("collectives"), min_ranks(2)]  # a message needs a peer

NUMEL = 29


def every_pair(world: int) -> list[tuple[int, int]]:
    return [(src, dst) for src in range(world) for dst in range(world) if src != dst]


def check_send_recv(ranks, dtype, pairs=None, impl="torch"):
    salt, world = f"p2p/{dtype}", ranks.world_size
    pairs = pairs or every_pair(world)
    results = data.run_packed(ranks, bodies.send_recv_pairs_on_rank, salt, dtype, NUMEL, pairs, impl=impl)
    problems = []
    for src, dst in pairs:
        got = results[dst].get(f"{src}->{dst}")
        want = data.payload(f"{salt}/{src}->{dst}", src, NUMEL, dtype)
        problem = "nothing received" if got is None else data.same_bits(got, want)
        if problem:
            problems.append(f"send from rank {src} to rank {dst}: {problem}")
    raise_problems(problems, f"send/recv on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=[requires("bf16")] if d == "bfloat16" else [])
                                   for d in data.MOVEMENT_DTYPES])
def test_send_recv(ranks, dtype):
    check_send_recv(ranks, dtype)


@world_size(4)
def test_send_recv_between_ranks_other_than_0(ranks):
    """1 -> 2, 3 -> 1 and 2 -> 3 while rank 0 takes no part."""
    check_send_recv(ranks, "float32", pairs=[(1, 2), (3, 1), (2, 3)])


def check_tags(ranks, count, impl="torch"):
    semantics = ranks.descriptor.semantics
    if not semantics.p2p_tags:  # messages of different sizes would land in the wrong buffers, or hang
        pytest.skip(f"{ranks.descriptor.name} matches point-to-point messages by posting order, not by tag "
                    f"(semantics.p2p_tags: false; {semantics.sources.get('p2p_tags', ranks.descriptor.source)})")
    salt, world = f"p2p/tags/{count}", ranks.world_size
    results = data.run_packed(ranks, bodies.isend_irecv_tags_on_rank, salt, count, impl=impl)
    problems = []
    for rank, received in enumerate(results):
        prev = (rank - 1) % world
        for tag, got in enumerate(received):
            if (problem := data.same_bits(got, data.payload(f"{salt}/{tag}", prev, 5 + tag, "int64"))) is not None:
                problems.append(f"rank {rank}: message with tag {tag} from rank {prev}: {problem}")
    raise_problems(problems, f"isend/irecv with {count} tagged messages in flight over {ranks.backend}")


@pytest.mark.parametrize("count", [3, 64])
def test_isend_irecv_tags(ranks, count):
    check_tags(ranks, count)


def check_batch(ranks, dtype, impl="torch"):
    salt, world = f"p2p/batch/{dtype}", ranks.world_size
    results = data.run_packed(ranks, bodies.batch_isend_irecv_on_rank, salt, dtype, impl=impl)
    problems = []
    for rank, (from_prev, from_next) in enumerate(results):
        prev, nxt = (rank - 1) % world, (rank + 1) % world
        for what, got, want in (("from the previous rank", from_prev, data.payload(f"{salt}/fwd", prev, 6, dtype)),
                                ("from the next rank", from_next, data.payload(f"{salt}/bwd", nxt, 9, dtype))):
            if (problem := data.same_bits(got, want)) is not None:
                problems.append(f"rank {rank}: {what}: {problem}")
    raise_problems(problems, f"batch_isend_irecv on {dtype} over {ranks.backend}")


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_batch_isend_irecv(ranks, dtype):
    check_batch(ranks, dtype)
