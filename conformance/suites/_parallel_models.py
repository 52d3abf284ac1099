"""The models, data and single-process references of the parallelisms suite (run on the ranks).

Weights start as small multiples of 1/16, inputs and targets are small integers, batch sizes,
micro-batch counts and the learning rate powers of two: nothing but the order of addition separates a
parallel run from the reference (no division that rounds differently per rank count).

A training record is ``{"grads": [{name: grad or None} per step], "params": {name: tensor},
"losses": [float per step]}``, on the CPU; the suite compares a parallel run's record with the
reference's (``_parallel_checks``).
"""

from __future__ import annotations

import importlib
from typing import Callable

STEPS = 3
LR = 2.0 ** -4
BATCH_PER_RANK = 4
IN, HIDDEN, TP_HIDDEN, UNEVEN, OUT = 8, 16, 12, 5, 4


def resolve(name: str, default: Callable, what: str) -> Callable:
    """``default`` for ``"torch"``, else the object at ``"package.module:ATTRIBUTE"`` (the project's tests
    hand the suite broken stand-ins this way; every rank imports the module itself)."""
    if name == "torch":
        return default
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {name!r}: expected 'torch' or 'package.module:ATTRIBUTE'")
    return getattr(importlib.import_module(module), attr)


def _generator(seed: int):
    import torch

    return torch.Generator(device="cpu").manual_seed(seed)


def _dyadic_(module, seed: int) -> None:
    import torch

    gen = _generator(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randint(-4, 5, param.shape, generator=gen, device="cpu").float() / 16)


def _net_class():
    import torch
    from torch import nn

    class Net(nn.Module):
        """fc0 -> relu -> fc1 -> relu -> fc2 -> relu -> head. fc1/fc2 are the tensor-parallel region
        (colwise, rowwise); fc2 has 5 rows, which no world size of 2 or more divides (FSDP's uneven
        shard); ``unused`` (when present) never takes part in forward."""

        def __init__(self, device, unused: bool = False):
            super().__init__()
            self.fc0 = nn.Linear(IN, HIDDEN, device=device)
            self.fc1 = nn.Linear(HIDDEN, TP_HIDDEN, device=device)
            self.fc2 = nn.Linear(TP_HIDDEN, UNEVEN, device=device)
            self.head = nn.Linear(UNEVEN, OUT, device=device)
            self.unused = nn.Linear(IN, OUT, device=device) if unused else None

        def forward(self, x):
            h = torch.relu(self.fc0(x))
            h = torch.relu(self.fc1(h))
            h = torch.relu(self.fc2(h))
            return self.head(h)

    return Net


def net(device, *, seed: int = 0, unused: bool = False):
    """The suite's small model (437 parameters), dyadic, on ``device``."""
    model = _net_class()(device, unused=unused)
    _dyadic_(model, seed)
    return model


def blocks(count: int, device, *, seed: int = 0):
    """``count`` blocks of Linear(8, 8) + ReLU (the last without ReLU), for pipelining."""
    from torch import nn

    layers = [nn.Sequential(nn.Linear(IN, IN, device=device), nn.ReLU()) if i < count - 1
              else nn.Sequential(nn.Linear(IN, IN, device=device)) for i in range(count)]
    model = nn.Sequential(*layers)
    _dyadic_(model, seed)
    return model


def batch(step: int, size: int, device, *, width: int = OUT):
    """The global batch of ``step``: ``size`` samples of small integers, and their targets."""
    import torch

    gen = _generator(1000 + step)
    x = torch.randint(-3, 4, (size, IN), generator=gen, device="cpu").float()
    y = torch.randint(-3, 4, (size, width), generator=gen, device="cpu").float()
    return x.to(device), y.to(device)


def mse(out, target):
    return ((out - target) ** 2).mean()


def local_tensor(t):
    """A DTensor's full value, else the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def snapshot(named) -> dict:
    """``{name: full value on the CPU}`` of ``(name, tensor or None)`` pairs."""
    return {name: None if t is None else local_tensor(t.detach()).cpu().clone() for name, t in named}


def grads_of(model) -> dict:
    return snapshot((name, p.grad) for name, p in model.named_parameters())


def params_of(model) -> dict:
    return snapshot(model.named_parameters())


def record(grads: list, params: dict, losses: list) -> dict:
    return {"grads": grads, "params": params, "losses": losses}


def train_reference(model, batches, step_loss: Callable | None = None) -> dict:
    """SGD on one process over ``batches`` (a list of ``(x, y)``): the record to compare with.
    ``step_loss(model, x, y)`` runs forward and backward and returns the loss (default: mse on the batch)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads, losses = [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        if step_loss is None:
            loss = mse(model(x), y)
            loss.backward()
        else:
            loss = step_loss(model, x, y)
        grads.append(grads_of(model))
        losses.append(float(loss))
        opt.step()
    return record(grads, params_of(model), losses)
