"""The small models the precompile suite compiles, built identically on every rank.

Each ``ModelSpec`` builds its module with a fixed seed (so every rank holds the same weights without
shipping them), makes the example inputs, and says whether its batch dimension is compiled dynamic
and whether it runs a collective (then every rank must take part in any real call). Modules are
passed to the compiled function as arguments, never closed over: a function closing over a global
module cannot be serialised; and the classes live at module level, because a serialised artifact
names them and the loading process imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

__all__ = ["MODELS", "ModelSpec", "forward", "model_spec"]


def forward(model, x):
    """The function every precompile path compiles: the model is an argument, not a global."""
    return model(x)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class TransformerBlock(torch.nn.Module):
    """Pre-norm attention (causal SDPA) and a GELU feed-forward, each with a residual."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class AllReduceMLP(torch.nn.Module):
    """A linear layer whose output is summed over the group by a functional collective."""

    def __init__(self, group_name: str):
        super().__init__()
        self.group_name = group_name
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = funcol.all_reduce(self.fc(x), "sum", self.group_name)
        return F.gelu(funcol.wait_tensor(y))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable          # build(ctx) -> module on ctx.device, same weights on every rank
    example: Callable        # example(ctx) -> tuple of inputs, same on every rank
    dynamic_batch: bool      # compile dim 0 of the first input as dynamic
    collective: bool = False

    def key(self, ctx) -> str:
        """What identifies a build: the group name is baked into a collective's graph, and an
        accelerator's index into Dynamo's guards and Inductor's code (a build on cuda:0 is not one
        for cuda:1; on CPU every rank shares one)."""
        key = f"{self.name}-g{ctx.group.group_name}" if self.collective else self.name
        device = ctx.device
        return key if device.type == "cpu" else f"{key}-{device.type}{device.index or 0}"


def _seeded(factory):
    def build(ctx):
        # Initialised on the host from the CPU generator (the same weights whatever the device), then moved.
        torch.manual_seed(1234)
        with torch.device("cpu"):
            module = factory(ctx)
        return module.to(ctx.device).eval()
    return build


def _input(*shape, seed: int = 7):
    def make(ctx):
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=generator, device="cpu").to(ctx.device),)
    return make


MODELS = {
    "mlp": ModelSpec("mlp", _seeded(lambda ctx: MLP()), _input(4, 16), dynamic_batch=True),
    "transformer": ModelSpec("transformer", _seeded(lambda ctx: TransformerBlock()), _input(2, 8, 16),
                             dynamic_batch=False),
    "allreduce": ModelSpec("allreduce", _seeded(lambda ctx: AllReduceMLP(ctx.group.group_name)), _input(4, 16),
                           dynamic_batch=False, collective=True),
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown precompile model {name!r}; known: {', '.join(MODELS)}") from None
