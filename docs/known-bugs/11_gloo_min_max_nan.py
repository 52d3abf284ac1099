"""gloo: all_reduce(MIN/MAX) loses a NaN that rank 1 holds (known bug 11).

Report text (ready to file at pytorch/gloo or pytorch/pytorch):

    Title: gloo all_reduce MIN/MAX drops NaN depending on which rank holds it

    With the gloo backend, all_reduce(op=MAX) and all_reduce(op=MIN) do not propagate NaN the way eager
    torch.max/torch.min (and NCCL) do: on 2 ranks, whenever one side is NaN the result is rank 0's
    value. A NaN held by rank 0 survives; a NaN held by rank 1 is lost, whatever rank 0 holds (an
    infinity of either sign or a finite number). Measured with torch 2.13.0+cpu, MAX and MIN alike:

        rank 0   rank 1   MAX and MIN   eager torch.stack(...).max(0) / .min(0)
        nan      inf      nan           nan
        inf      nan      inf           nan
        nan      2.0      nan           nan
        2.0      nan      2.0           nan
        nan      -inf     nan           nan
        -inf     nan      -inf          nan

    gloo's max/min (gloo/math.h) are elementwise comparisons that are false whenever one side is NaN,
    so the accumulator (rank 0's value) is kept. Expected: NaN in every case, as with NCCL and eager.

    Reproduce: python 11_gloo_min_max_nan.py (2 gloo ranks on one machine; prints the table above).

Run: ``python docs/known-bugs/11_gloo_min_max_nan.py``. Prints one line per case; exit status 0.
"""

import torch
import torch.distributed as dist

from _ranks import spawn

CASES = [(float("nan"), float("inf")), (float("inf"), float("nan")), (float("nan"), 2.0), (2.0, float("nan")),
         (float("nan"), float("-inf")), (float("-inf"), float("nan"))]


def body(rank: int, world: int) -> None:
    for pair in CASES:
        row = []
        for op in ("MAX", "MIN"):
            t = torch.tensor([pair[rank]])
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            eager = getattr(torch.tensor(pair), op.lower())().item()
            row.append(f"{op} {t.item()} (eager {eager})")
        if rank == 0:
            print(f"torch {torch.__version__}: rank 0 holds {pair[0]}, rank 1 holds {pair[1]}: " + ", ".join(row))


if __name__ == "__main__":
    spawn(body, 2)
