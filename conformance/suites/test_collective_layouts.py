"""Collectives on tensors that are not plain contiguous buffers: views into larger memory (a column,
a transposed block, a storage offset, an expanded row), empty tensors, and large messages.

A view's output must hold the right values and the memory around it must stay untouched
(``_layouts``), or every rank must refuse the layout with an error saying so; empty tensors must pass through every collective; a large message (bounded on CPU,
at least 64 MiB plus one element on accelerators, to cross chunk boundaries) must arrive exactly.
Every check takes ``impl`` (see ``test_collectives``).
"""

from __future__ import annotations

import pytest

from conformance import RankError, min_ranks, requires
from conformance.suites import _collective_bodies as bodies
from conformance.suites import _collective_data as data
from conformance.suites import _layouts as layouts
from conformance.suites.test_collectives import raise_problems

pytestmark = requires("collectives")


def refused_everywhere(exc: RankError, world: int) -> bool:
    """Every rank raised, each saying the tensor must be contiguous: a clear refusal, not a bug."""
    return (type(exc) is RankError and sorted(exc.failed_ranks) == list(range(world))
            and all("contiguous" in e.message for e in exc.errors))


def check_layout(ranks, collective, layout, impl="torch"):
    salt, world = f"layout/{collective}/{layout}", ranks.world_size
    try:
        records = ranks.run(layouts.layout_on_rank, salt, collective, layout, impl=impl)
    except RankError as exc:
        if refused_everywhere(exc, world):
            return
        raise
    problems = []
    for rank, record in enumerate(records):
        wanted = layouts.expected(salt, collective, layout, rank, world)
        if len(record["outputs"]) != len(wanted):
            problems.append(f"rank {rank}: {len(record['outputs'])} outputs, expected {len(wanted)}")
        for i, (got, want) in enumerate(zip(record["outputs"], wanted)):
            if (problem := data.same_bits(got, want)) is not None:
                problems.append(f"rank {rank}: output view {i}: {problem}")
        problems += [f"rank {rank}: around output view {i}: {p}" for i, p in enumerate(record["neighbours"]) if p]
        problems += [f"rank {rank}: input view {i}: {p}" for i, p in enumerate(record["inputs_changed"]) if p]
    raise_problems(problems, f"{collective} on a {layout} view over {ranks.backend}")


@pytest.mark.parametrize("collective, layout", [
    # a point-to-point message needs a peer
    pytest.param(c, l, id=f"{c}-{l}", marks=[min_ranks(2)] if c == "isend_irecv" else [])
    for c, l in layouts.cases()
])
def test_view(ranks, collective, layout):
    check_layout(ranks, collective, layout)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_zero_size(ranks, dtype):
    shapes = ranks.run(bodies.zero_size_on_rank, dtype)
    for rank, seen in enumerate(shapes):
        assert all(shape == (0,) for shape in seen), (
            f"rank {rank}: collectives on empty {dtype} tensors over {ranks.backend} left shapes {seen}, "
            "expected every one (0,)")


def check_large_message(ranks, impl="torch"):
    records = ranks.run(bodies.large_on_rank, "large", impl=impl)
    problems = [f"rank {rank}: {name}: {problem}" for rank, record in enumerate(records)
                for name, problem in record.items() if name != "numel" and problem]
    raise_problems(problems, f"collectives on {records[0]['numel']} float32 elements over {ranks.backend}")


def test_large_message(ranks):
    check_large_message(ranks)
