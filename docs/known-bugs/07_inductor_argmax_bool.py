"""Compiled argmax/argmin accept bool input that eager refuses (known bug 7).

Report text (ready to file at pytorch/pytorch):

    Title: torch.compile'd argmax/argmin accept bool tensors; eager raises

    Eager torch.argmax/argmin raise "argmax(): does not support bool input". Compiled with Inductor
    (CPU), the same function returns an index instead of raising.

        x = torch.tensor([[True, True, False, True, False]])
        torch.compile(lambda t: t.argmax())(x)    # tensor(0); eager raises

    Reproduce: python 07_inductor_argmax_bool.py (one process, needs a C++ compiler).

Run: ``python docs/known-bugs/07_inductor_argmax_bool.py``.
"""

import torch

x = torch.tensor([[True, True, False, True, False]])
try:
    eager = repr(x.argmax())
except RuntimeError as exc:
    eager = f"RuntimeError: {exc}"
try:
    compiled = repr(torch.compile(lambda t: t.argmax())(x))
except Exception as exc:  # noqa: BLE001 - the error is the observation
    compiled = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
print(f"torch {torch.__version__}: compiled {compiled}; eager {eager}")
