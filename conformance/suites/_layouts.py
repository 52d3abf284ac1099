"""Collectives on tensors that are views into larger memory: the layouts, the rank function, and what
each collective must leave in the view and around it.

A view lives in a *canvas* filled with a sentinel. After the collective, its output views must hold
the right values, every canvas element outside them must still be the sentinel (a backend that
copies a strided view as if it were contiguous writes into its neighbours), and input views and
their canvases must be unchanged. Layouts:

* ``column``: a column of an (n, 3) matrix (stride 3)
* ``transposed``: a (4, k) transposed block of a larger matrix (not contiguous, neighbours on two sides)
* ``offset``: a contiguous slice with a storage offset, neighbours on both sides
* ``expanded``: an expanded row (stride 0; inputs only, a collective may not write to it)

A backend may refuse a layout instead, with an error that says the tensor must be contiguous, on
every rank (the check accepts that); what it may not do is return wrong values or write elsewhere.

Values are integer-valued float32 (``reduce_input``), so sums are exact and every check is exact.
"""

from __future__ import annotations

from typing import Any

from conformance.suites._collective_data import reduce_input
from conformance.suites._collective_impls import resolve_dist

LAYOUTS = ("column", "transposed", "offset", "expanded")
SENTINEL = -777.0
ROWS, COLS = 4, 6  # the logical shape of one rank's block: (ROWS, COLS); multiples of it along dim 0
# collective -> whether it writes into its input (then an expanded input is not allowed)
COLLECTIVES = {"all_reduce": True, "broadcast": True, "reduce": True, "all_gather_into_tensor": False,
               "all_gather": False, "reduce_scatter_tensor": False, "all_to_all_single": False, "scatter": False,
               "gather": False, "isend_irecv": False}


def cases() -> list[tuple[str, str]]:
    return [(c, layout) for c in COLLECTIVES for layout in LAYOUTS if not (COLLECTIVES[c] and layout == "expanded")]


def logical(salt: str, rank: int, blocks: int, layout: str):
    """The logical (contiguous) values of a (blocks * ROWS, COLS) input; an expanded one repeats a row."""
    rows = blocks * ROWS
    if layout == "expanded":
        return reduce_input(salt, rank, COLS, "float32", "SUM").view(1, COLS).expand(rows, COLS).contiguous()
    return reduce_input(salt, rank, rows * COLS, "float32", "SUM").view(rows, COLS)


def make_view(layout: str, rows: int, device) -> tuple[Any, Any]:
    """(canvas, view): an output-capable view of shape (rows, COLS), or 1-D for ``column`` (the flat
    form of the same values), inside a sentinel-filled canvas."""
    import torch

    numel = rows * COLS
    if layout == "column":
        canvas = torch.full((numel, 3), SENTINEL, device=device)
        return canvas, canvas[:, 1]
    if layout == "offset":
        canvas = torch.full((numel + 7,), SENTINEL, device=device)
        return canvas, canvas[3:3 + numel].view(rows, COLS)
    if layout == "transposed":
        canvas = torch.full((COLS + 1, rows + 2), SENTINEL, device=device)
        return canvas, canvas[1:COLS + 1, :rows].t()
    raise ValueError(f"layout {layout!r} cannot be written to")


def make_input(layout: str, values, device) -> tuple[Any, Any]:
    """(canvas, view) holding ``values`` (shape (rows, COLS)) in ``layout``."""
    if layout == "expanded":
        base = values[:1].to(device).clone()
        return base, base.expand(values.shape[0], COLS)
    canvas, view = make_view(layout, values.shape[0], device)
    view.copy_(values.reshape(view.shape))
    return canvas, view


def _neighbours_changed(canvas, view) -> str | None:
    """None when every canvas element outside ``view`` still holds the sentinel."""
    import torch

    flat = canvas.reshape(-1)
    outside = torch.ones(flat.numel(), dtype=torch.bool, device=canvas.device)
    offset = view.storage_offset() - canvas.storage_offset()
    covered = torch.as_strided(torch.arange(flat.numel(), device=canvas.device), view.shape, view.stride(), offset)
    outside[covered.reshape(-1)] = False
    changed = (flat != SENTINEL) & outside
    if not bool(changed.any()):
        return None
    first = int(changed.nonzero()[0])
    return (f"{int(changed.sum())} elements outside the view were overwritten, first at canvas index {first} "
            f"(now {flat[first].item()!r})")


def layout_on_rank(ctx, salt: str, collective: str, layout: str, impl: str = "torch"):
    """Run ``collective`` with its tensors in ``layout``. ``{"outputs": [contiguous values of each output
    view], "neighbours": [problem or None per output canvas], "inputs_changed": [problem or None]}``."""
    import torch

    dist = resolve_dist(impl)
    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    last = world - 1
    out_layout = "offset" if layout == "expanded" else layout
    outputs: list[tuple[Any, Any]] = []
    inputs: list[tuple[Any, Any, Any]] = []  # (canvas, view, values before)

    def inp(blocks: int, key: str = "", of_rank: int | None = None):
        values = logical(f"{salt}{key}", rank if of_rank is None else of_rank, blocks, layout)
        canvas, view = make_input(layout, values, device)
        inputs.append((canvas, view, canvas.clone()))
        return view

    def out(blocks: int):
        canvas, view = make_view(out_layout, blocks * ROWS, device)
        outputs.append((canvas, view))
        return view

    if COLLECTIVES[collective]:  # in place: the input view is the output
        canvas, view = make_view(layout, ROWS, device)
        view.copy_(logical(salt, rank, 1, layout).reshape(view.shape))
        outputs.append((canvas, view))
        if collective == "all_reduce":
            dist.all_reduce(view)
        elif collective == "broadcast":
            dist.broadcast(view, src=last)
        else:
            dist.reduce(view, dst=last)
            if rank != last:
                outputs.clear()  # non-dst contents are unspecified
    elif collective == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out(world), inp(1))
    elif collective == "all_gather":
        dist.all_gather([out(1) for _ in range(world)], inp(1))
    elif collective == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out(1), inp(world))
    elif collective == "all_to_all_single":
        dist.all_to_all_single(out(world), inp(world))
    elif collective == "scatter":
        chunks = [inp(1, "/scatter", of_rank=r) for r in range(world)] if rank == last else None
        dist.scatter(out(1), chunks, src=last)
    elif collective == "gather":
        listed = [out(1) for _ in range(world)] if rank == last else None
        dist.gather(inp(1), listed, dst=last)
    else:  # isend_irecv: a ring, every rank sends its block to the next one
        works = [dist.isend(inp(1), dst=(rank + 1) % world), dist.irecv(out(1), src=(rank - 1) % world)]
        for work in works:
            work.wait()
    return {
        "outputs": [view.reshape(-1, COLS).clone() for _, view in outputs],
        "neighbours": [_neighbours_changed(canvas, view) for canvas, view in outputs],
        "inputs_changed": [None if torch.equal(canvas, before) else "the input (or memory next to it) was modified"
                           for canvas, _, before in inputs],
    }


def expected(salt: str, collective: str, layout: str, rank: int, world: int) -> list:
    """What rank ``rank``'s output views must hold, in the order ``layout_on_rank`` made them."""
    import torch

    last = world - 1
    block = [logical(salt, r, 1, layout) for r in range(world)]
    if collective == "all_reduce":
        return [sum(block)]
    if collective == "broadcast":
        return [block[last]]
    if collective == "reduce":
        return [sum(block)] if rank == last else []
    if collective == "all_gather_into_tensor":
        return [torch.cat(block)]
    if collective == "all_gather":
        return block
    wide = [logical(salt, r, world, layout) for r in range(world)]
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    if collective == "reduce_scatter_tensor":
        return [sum(wide)[mine]]
    if collective == "all_to_all_single":
        return [torch.cat([w[mine] for w in wide])]
    if collective == "scatter":
        return [logical(f"{salt}/scatter", rank, 1, layout)]
    if collective == "gather":
        return block if rank == last else []
    return [block[(rank - 1) % world]]
