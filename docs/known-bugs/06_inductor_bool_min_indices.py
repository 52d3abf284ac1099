"""Inductor returns wrong min(dim) indices for bool tensors (known bug 6; upstream:
https://github.com/pytorch/pytorch/issues/184893, fixed after 2.13).

Run: ``python docs/known-bugs/06_inductor_bool_min_indices.py`` (one process, needs a C++ compiler).
"""

import torch

x = torch.tensor([[True, True, False, True, False]])
print(f"torch {torch.__version__}: compiled {torch.compile(lambda t: t.min(1).indices)(x)!r}; "
      f"eager {x.min(1).indices!r}")
