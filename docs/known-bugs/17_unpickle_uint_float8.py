"""Tensors of dtypes uint16, uint32, uint64 and float8 cannot be unpickled (known bug 17).

Report text (ready to file at pytorch/pytorch):

    Title: pickle.loads of a uint16/uint32/uint64/float8 tensor raises "'UntypedStorage' has no attribute 'dtype'"

    pickle.loads(pickle.dumps(torch.zeros(3, dtype=torch.uint16))) raises AttributeError: type object
    'torch.storage.UntypedStorage' has no attribute 'dtype' (the same for uint32, uint64,
    float8_e4m3fn, float8_e5m2); torch.save/torch.load round-trip them. Anything that moves tensors by
    pickle (multiprocessing queues, RPC, object collectives) fails on these dtypes.

    Reproduce: python 17_unpickle_uint_float8.py (one process).

Run: ``python docs/known-bugs/17_unpickle_uint_float8.py``.
"""

import pickle

import torch

for dtype in (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.int16):
    try:
        pickle.loads(pickle.dumps(torch.zeros(3, dtype=dtype)))
        got = "round-trips"
    except Exception as exc:  # noqa: BLE001 - the error is the observation
        got = f"{type(exc).__name__}: {exc}"
    print(f"torch {torch.__version__}: {dtype}: {got}")
