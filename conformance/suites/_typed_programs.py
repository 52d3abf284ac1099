"""Typed distributed programs (spmd-types local types) run on every rank, next to their references.

Triggered by ``test_typed_collectives``: each rank function here runs on the pool's real process
group under spmd-types' checker, calls every collective through the ``CollectiveSet`` named by
``impl`` (``_collective_impls``), and returns ``Check`` records: what it computed next to what a
single-process reference on the full tensors (float64, same rounded inputs) says it must be;
``_typed_checks`` compares them in the controller. Rejected programs return the error they raised
as ``"Type: message"``.

Meshes: ``"1d"`` is the default group as one axis ``tp``; ``"dp_x_tp"`` needs 4 ranks (rank =
2 * dp + tp) and adds a data-parallel outer axis to the programs in ``MESH_PROGRAMS``: the batch
is V on dp, weights are R on dp (their gradients sum over dp peers), the loss is reinterpreted
V -> P on dp. The other programs have no 2-D form that tests anything new: FSDP, context- and
expert-parallel and the vocab-parallel loss would only add that same batch split over dp; the
Partial algebra, the regulariser and the unchecked missing-f program are properties of one axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from conformance.suites._typed_checks import Check

__all__ = [
    "PROGRAMS", "MESH_PROGRAMS", "PRIMITIVES", "RAW_COLLECTIVES", "REJECTED",
    "run_program", "run_primitive", "run_raw_collective", "run_rejected",
]

# -- meshes ---------------------------------------------------------------------------------------

@dataclass
class Mesh:
    """The axes a program runs on, and where this rank sits on them."""

    tp: Any
    tp_size: int
    tp_index: int
    device: Any  # this rank's torch.device: every tensor a program makes lives there
    dp: Any = None
    dp_size: int = 1
    dp_index: int = 0
    # Ranks that share this rank's tp index: weights are R on dp, so their gradients are Partial
    # there and these ranks' values add up (the ``summed_over`` of a Check). None without dp.
    dp_peers: tuple[int, ...] | None = None

    def rand(self, seed: int, *shape: int, dtype=None, integers: bool = False):
        """``_rand`` on this rank's device."""
        return _rand(seed, *shape, device=self.device, dtype=dtype, integers=integers)

    def types(self, tp_type, dp_type=None) -> dict:
        """A local-type dict for ``assert_type``: ``tp_type`` on tp, plus ``dp_type`` when there is a dp axis."""
        out = {self.tp: tp_type}
        if self.dp is not None:
            out[self.dp] = dp_type
        return out


_SUBGROUPS: dict[int, tuple] = {}


def _mesh(ctx, name: str) -> Mesh:
    import torch.distributed as dist

    if name == "1d":
        return Mesh(tp=ctx.group, tp_size=ctx.world_size, tp_index=ctx.rank, device=ctx.device)
    if name != "dp_x_tp":
        raise ValueError(f"unknown mesh {name!r}: expected '1d' or 'dp_x_tp'")
    if ctx.world_size != 4:
        raise ValueError(f"mesh 'dp_x_tp' needs exactly 4 ranks, this pool has {ctx.world_size}")
    key = id(ctx.group)  # a replaced default group needs new subgroups
    if key not in _SUBGROUPS:
        # Every rank creates every subgroup, in the same order, as new_group requires.
        tp_groups = [dist.new_group([2 * d, 2 * d + 1]) for d in range(2)]
        dp_groups = [dist.new_group([t, t + 2]) for t in range(2)]
        _SUBGROUPS.clear()
        _SUBGROUPS[key] = (tp_groups, dp_groups)
    tp_groups, dp_groups = _SUBGROUPS[key]
    dp_index, tp_index = divmod(ctx.rank, 2)
    return Mesh(tp=tp_groups[dp_index], tp_size=2, tp_index=tp_index, device=ctx.device,
                dp=dp_groups[tp_index], dp_size=2,
                dp_index=dp_index, dp_peers=(tp_index, tp_index + 2))


# -- data and references --------------------------------------------------------------------------

def _rand(seed: int, *shape: int, device, dtype=None, integers: bool = False):
    """The same tensor on every rank, on ``device``: drawn on the host from a seeded generator (a device's
    own generator would give other values), then moved and rounded to ``dtype``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if integers:
        values = torch.randint(-4, 5, shape, generator=gen, device="cpu").float()
    else:
        values = torch.randn(*shape, generator=gen, device="cpu")
    return values.to(device=device, dtype=dtype)


def _leaf(tensor):
    return tensor.detach().clone().requires_grad_()


def _reference(fn: Callable, **inputs):
    """Run ``fn`` on float64 copies of the full inputs: (its outputs, {name: grad})."""
    from spmd_types import no_typecheck

    # The reference is plain single-process torch: outside the checker, whatever the tensors carry.
    with no_typecheck():
        leaves = {name: value.detach().double().requires_grad_() for name, value in inputs.items()}
        loss, outputs = fn(**leaves)
        loss.backward()
    return outputs, {name: leaf.grad for name, leaf in leaves.items()}


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _wire(dtype) -> dict:
    """Keyword arguments for a typed collective on ``dtype``.

    spmd-types refuses to pick the precision of a backward reduction on reduced-precision inputs;
    the suite asks for the input's own dtype, so a bf16 program communicates in bf16 both ways.
    """
    import torch

    return {"backward_options": {"op_dtype": dtype}} if dtype in (torch.bfloat16, torch.float16) else {}


# -- accepted programs ----------------------------------------------------------------------------
# Each takes (mesh, C, dtype) and returns a list of Check. It runs under spmd-types' checker.

B, D, S = 4, 6, 8  # batch, model width, sequence length (all divisible by 2)


def _batch_slice(mesh: Mesh, tensor):
    """The rows of a batch-sized tensor this rank owns on the dp axis (all of them without one)."""
    return tensor.chunk(mesh.dp_size, 0)[mesh.dp_index] if mesh.dp is not None else tensor


def _loss_to_partial(mesh: Mesh, loss, st):
    """A rank's loss over its own batch rows is Varying on dp: reinterpret it as Partial (summed)."""
    return st.reinterpret(loss, mesh.dp, src=st.V, dst=st.P) if mesh.dp is not None else loss


def program_tp_mlp(mesh: Mesh, C, dtype) -> list[Check]:
    """Megatron tensor-parallel MLP: x I, W1 V (rows), W2 V (columns), f = invariant_to_replicate, g = all_reduce(P -> I)."""
    import torch.nn.functional as F
    import spmd_types as st

    H = 4 * mesh.tp_size
    x, w1, w2, g = mesh.rand(1, B, D, dtype=dtype), mesh.rand(2, H, D, dtype=dtype), mesh.rand(3, D, H, dtype=dtype), \
        mesh.rand(4, B, D, dtype=dtype)
    x_l, g_l = _leaf(_batch_slice(mesh, x)), _batch_slice(mesh, g)
    w1_l = _leaf(w1.chunk(mesh.tp_size, 0)[mesh.tp_index])
    w2_l = _leaf(w2.chunk(mesh.tp_size, 1)[mesh.tp_index])
    st.assert_type(x_l, mesh.types(st.I, st.V))
    st.assert_type(g_l, mesh.types(st.I, st.V))
    st.assert_type(w1_l, mesh.types(st.V, st.R))
    st.assert_type(w2_l, mesh.types(st.V, st.R))
    h = st.invariant_to_replicate(x_l, mesh.tp, **_wire(dtype))
    y = C.all_reduce(F.linear(F.gelu(F.linear(h, w1_l)), w2_l), mesh.tp, src=st.P, dst=st.I, **_wire(dtype))
    _loss_to_partial(mesh, (y * g_l).sum(), st).backward()

    def ref(x, w1, w2):
        y = F.linear(F.gelu(F.linear(x, w1)), w2)
        return (y * g.double()).sum(), y

    y_ref, grads = _reference(ref, x=x, w1=w1, w2=w2)
    sliced = _batch_slice(mesh, y_ref), _batch_slice(mesh, grads["x"])
    return [
        Check("output y (I: the full output on every rank)", y, sliced[0]),
        Check("grad of x (I: the full gradient on every rank)", x_l.grad, sliced[1]),
        Check("grad of W1 (V: this rank's rows of the reference)", w1_l.grad,
              grads["w1"].chunk(mesh.tp_size, 0)[mesh.tp_index], summed_over=mesh.dp_peers),
        Check("grad of W2 (V: this rank's columns of the reference)", w2_l.grad,
              grads["w2"].chunk(mesh.tp_size, 1)[mesh.tp_index], summed_over=mesh.dp_peers),
    ]


def _sequence_parallel(mesh: Mesh, C, dtype, gamma_type: str) -> list[Check]:
    import torch.nn.functional as F
    import spmd_types as st

    H, tp, r = 4 * mesh.tp_size, mesh.tp_size, mesh.tp_index
    # Each dp replica has its own S rows (a batch of one sequence), sharded on the sequence over tp.
    x, gamma = mesh.rand(11, mesh.dp_size * S, D, dtype=dtype), (1 + 0.5 * mesh.rand(12, D)).to(dtype)
    w1, w2, g = mesh.rand(13, H, D, dtype=dtype), mesh.rand(14, D, H, dtype=dtype), mesh.rand(15, mesh.dp_size * S, D, dtype=dtype)
    x_l, g_l = _leaf(_batch_slice(mesh, x).chunk(tp, 0)[r]), _batch_slice(mesh, g).chunk(tp, 0)[r]
    gamma_l, w1_l, w2_l = _leaf(gamma), _leaf(w1.chunk(tp, 0)[r]), _leaf(w2.chunk(tp, 1)[r])
    st.assert_type(x_l, mesh.types(st.S(0), st.V))
    st.assert_type(g_l, mesh.types(st.S(0), st.V))
    st.assert_type(w1_l, mesh.types(st.V, st.R))
    st.assert_type(w2_l, mesh.types(st.V, st.R))
    st.assert_type(gamma_l, mesh.types(getattr(st, gamma_type), st.R))
    gamma_used = gamma_l if gamma_type == "R" else st.invariant_to_replicate(gamma_l, mesh.tp, **_wire(dtype))
    h = F.layer_norm(x_l, (D,), weight=gamma_used)
    full = C.all_gather(h, mesh.tp, src=st.S(0), dst=st.R, **_wire(dtype))
    out = F.linear(F.gelu(F.linear(full, w1_l)), w2_l)
    y = C.reduce_scatter(out, mesh.tp, src=st.P, dst=st.S(0), **_wire(dtype))
    _loss_to_partial(mesh, st.reinterpret((y * g_l).sum(), mesh.tp, src=st.V, dst=st.P), st).backward()

    def ref(x, gamma, w1, w2):
        y = F.linear(F.gelu(F.linear(F.layer_norm(x, (D,), weight=gamma), w1)), w2)
        return (y * g.double()).sum(), y

    def rows(full):
        return _batch_slice(mesh, full).chunk(tp, 0)[r]

    y_ref, grads = _reference(ref, x=x, gamma=gamma, w1=w1, w2=w2)
    gamma_check = (Check("grad of gamma (R: the ranks' partial gradients sum to the reference)", gamma_l.grad,
                         grads["gamma"], summed_over=tuple(range(tp * mesh.dp_size)))
                   if gamma_type == "R" else
                   Check("grad of gamma (I after invariant_to_replicate: the full gradient on every rank)",
                         gamma_l.grad, grads["gamma"], summed_over=mesh.dp_peers))
    return [
        Check("output shard y (S(0): this rank's rows)", y, rows(y_ref)),
        Check("grad of x (S(0): this rank's rows)", x_l.grad, rows(grads["x"])),
        Check("grad of W1 (V: this rank's rows)", w1_l.grad, grads["w1"].chunk(tp, 0)[r],
              summed_over=mesh.dp_peers),
        Check("grad of W2 (V: this rank's columns)", w2_l.grad, grads["w2"].chunk(tp, 1)[r],
              summed_over=mesh.dp_peers),
        gamma_check,
    ]


def program_sequence_parallel_gamma_R(mesh, C, dtype):
    """Sequence-parallel LayerNorm + MLP, gamma Replicate: its partial gradients sum to the reference."""
    return _sequence_parallel(mesh, C, dtype, "R")


def program_sequence_parallel_gamma_I(mesh, C, dtype):
    """Sequence-parallel LayerNorm + MLP, gamma Invariant via invariant_to_replicate: full gradient everywhere."""
    return _sequence_parallel(mesh, C, dtype, "I")


def _data_parallel(mesh: Mesh, C, dtype, weight_type: str) -> list[Check]:
    """The batch is split over the data axis: the one axis on "1d"; on "dp_x_tp", dp, with tensor
    parallelism inside (the weight's columns split over tp, x made R there by invariant_to_replicate)."""
    import spmd_types as st

    tp_inside = mesh.dp is not None
    data, data_size, data_index = (mesh.dp, mesh.dp_size, mesh.dp_index) if tp_inside else \
        (mesh.tp, mesh.tp_size, mesh.tp_index)
    K = 2 * mesh.tp_size if tp_inside else 3

    def columns(tensor):  # this rank's tp columns of a [*, K] tensor (all of them without tp inside)
        return tensor.chunk(mesh.tp_size, 1)[mesh.tp_index] if tp_inside else tensor

    def typed(tensor, data_type, tp_type):
        st.assert_type(tensor, {data: data_type, **({mesh.tp: tp_type} if tp_inside else {})})
        return tensor

    x, t = mesh.rand(21, 4 * data_size, D, dtype=dtype), mesh.rand(22, 4 * data_size, K, dtype=dtype)
    w = mesh.rand(23, D, K, dtype=dtype)
    x_l = typed(x.chunk(data_size, 0)[data_index], st.V, st.I)
    t_l = typed(columns(t.chunk(data_size, 0)[data_index]), st.V, st.V)
    w_l = typed(_leaf(columns(w)), getattr(st, weight_type), st.V)
    x_used = st.invariant_to_replicate(x_l, mesh.tp, **_wire(dtype)) if tp_inside else x_l
    w_used = w_l if weight_type == "R" else st.invariant_to_replicate(w_l, data, **_wire(dtype))
    loss = st.reinterpret(((x_used @ w_used - t_l) ** 2).sum(), data, src=st.V, dst=st.P)
    if tp_inside:  # each tp rank's loss covers its own columns: Partial on tp too
        loss = st.reinterpret(loss, mesh.tp, src=st.V, dst=st.P)
    loss.backward()
    total = C.all_reduce(loss.detach(), data, src=st.P, dst=st.I, **_wire(dtype))
    if tp_inside:
        total = C.all_reduce(total, mesh.tp, src=st.P, dst=st.I, **_wire(dtype))

    def ref(w):
        loss = ((x.double() @ w - t.double()) ** 2).sum()
        return loss, loss

    loss_ref, grads = _reference(ref, w=w)
    checks = [Check("loss after all_reduce(P -> I) (the full-batch loss)", total, loss_ref)]
    if weight_type == "R":
        with st.no_typecheck():
            reduced = C.raw_all_reduce(w_l.grad.contiguous(), data)
        checks.append(Check("grad of w (R) after all_reduce (the full-batch gradient)", reduced,
                            columns(grads["w"])))
    else:
        checks.append(Check("grad of w (I after invariant_to_replicate: the full-batch gradient on every rank)",
                            w_l.grad, columns(grads["w"])))
    return checks


def program_data_parallel_weight_R(mesh, C, dtype):
    """Data parallel: batch V, weight R, loss reinterpret(V -> P); the all-reduced weight grad is the full-batch one."""
    return _data_parallel(mesh, C, dtype, "R")


def program_data_parallel_weight_I(mesh, C, dtype):
    """Data parallel with weight I made R by invariant_to_replicate: the grad is the full-batch one on every rank."""
    return _data_parallel(mesh, C, dtype, "I")


def program_fsdp(mesh: Mesh, C, dtype) -> list[Check]:
    """FSDP-style: the weight is stored S(0) and all_gather(S(0) -> R) before use; shard grads are reference slices."""
    import torch.nn.functional as F
    import spmd_types as st

    K, tp, r = 4 * mesh.tp_size, mesh.tp_size, mesh.tp_index
    x, w, g = mesh.rand(31, 4 * tp, D, dtype=dtype), mesh.rand(32, K, D, dtype=dtype), mesh.rand(33, 4 * tp, K, dtype=dtype)
    x_l, g_l, w_l = x.chunk(tp, 0)[r], g.chunk(tp, 0)[r], _leaf(w.chunk(tp, 0)[r])
    st.assert_type(x_l, {mesh.tp: st.V})
    st.assert_type(g_l, {mesh.tp: st.V})
    st.assert_type(w_l, {mesh.tp: st.S(0)})
    w_full = C.all_gather(w_l, mesh.tp, src=st.S(0), dst=st.R, **_wire(dtype))
    y = F.linear(x_l, w_full)
    st.reinterpret((y * g_l).sum(), mesh.tp, src=st.V, dst=st.P).backward()

    def ref(w):
        y = F.linear(x.double(), w)
        return (y * g.double()).sum(), y

    y_ref, grads = _reference(ref, w=w)
    return [
        Check("gathered weight (R: the full weight)", w_full, w.double()),
        Check("output rows (V: this rank's batch)", y, y_ref.chunk(tp, 0)[r]),
        Check("grad of the weight shard (S(0): this rank's rows of the reference)", w_l.grad,
              grads["w"].chunk(tp, 0)[r]),
    ]


def program_context_parallel_attention(mesh: Mesh, C, dtype) -> list[Check]:
    """Causal attention with q, k, v sharded on the sequence; k, v all-gathered; mask from global positions."""
    import torch
    import spmd_types as st

    tp, r, dh = mesh.tp_size, mesh.tp_index, 4
    q, k, v, g = (mesh.rand(40 + i, S, dh, dtype=dtype) for i in range(4))
    q_l, k_l, v_l = (_leaf(t.chunk(tp, 0)[r]) for t in (q, k, v))
    g_l = g.chunk(tp, 0)[r]
    local = S // tp
    q_pos = torch.arange(local, device=mesh.device) + r * local
    mask = torch.arange(S, device=mesh.device)[None, :] > q_pos[:, None]  # this rank's rows of the global causal mask
    for t in (q_l, k_l, v_l, g_l):
        st.assert_type(t, {mesh.tp: st.S(0)})
    st.assert_type(mask, {mesh.tp: st.S(0)})
    k_full = C.all_gather(k_l, mesh.tp, src=st.S(0), dst=st.R, **_wire(dtype))
    v_full = C.all_gather(v_l, mesh.tp, src=st.S(0), dst=st.R, **_wire(dtype))
    scores = (q_l @ k_full.transpose(0, 1)) / math.sqrt(dh)
    out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v_full
    st.reinterpret((out * g_l).sum(), mesh.tp, src=st.V, dst=st.P).backward()

    full_mask = torch.arange(S, device=mesh.device)[None, :] > torch.arange(S, device=mesh.device)[:, None]

    def ref(q, k, v):
        out = torch.softmax(((q @ k.T) / math.sqrt(dh)).masked_fill(full_mask, float("-inf")), -1) @ v
        return (out * g.double()).sum(), out

    out_ref, grads = _reference(ref, q=q, k=k, v=v)
    return [Check("attention output (S(0): this rank's rows)", out, out_ref.chunk(tp, 0)[r])] + [
        Check(f"d{name} (S(0): this rank's rows)", leaf.grad, grads[name].chunk(tp, 0)[r])
        for name, leaf in (("q", q_l), ("k", k_l), ("v", v_l))
    ]


def program_vocab_parallel_cross_entropy(mesh: Mesh, C, dtype) -> list[Check]:
    """Vocab-parallel cross-entropy: logits S(-1), all_gather(dst=I), loss I, backward gives logits' slices."""
    import torch
    import torch.nn.functional as F
    import spmd_types as st

    tp, r, vocab = mesh.tp_size, mesh.tp_index, 5 * mesh.tp_size
    logits = mesh.rand(51, B, vocab, dtype=dtype)
    target = torch.tensor([0, vocab - 1, 3, vocab // 2], device=mesh.device)
    logits_l = _leaf(logits.chunk(tp, -1)[r])
    st.assert_type(logits_l, {mesh.tp: st.S(-1)})
    st.assert_type(target, {mesh.tp: st.I})
    full = C.all_gather(logits_l, mesh.tp, src=st.S(-1), dst=st.I, **_wire(dtype))
    loss = F.cross_entropy(full, target)
    loss.backward()

    def ref(logits):
        loss = F.cross_entropy(logits, target)
        return loss, loss

    loss_ref, grads = _reference(ref, logits=logits)
    return [
        Check("loss (I: the full loss on every rank)", loss, loss_ref),
        Check("grad of the logits shard (S(-1): this rank's vocabulary columns)", logits_l.grad,
              grads["logits"].chunk(tp, -1)[r]),
    ]


def _expert_parallel(mesh: Mesh, C, dtype, uneven: bool) -> list[Check]:
    import torch
    import torch.nn.functional as F
    import spmd_types as st

    tp, r = mesh.tp_size, mesh.tp_index
    # Rank s sends sends[s][e] tokens to expert e (the expert living on rank e).
    sends = [[(s + e + 1) if uneven else 2 for e in range(tp)] for s in range(tp)]
    counts = [sum(row) for row in sends]
    tokens = mesh.rand(61, sum(counts), D, dtype=dtype)
    experts, g = mesh.rand(62, tp, D, D, dtype=dtype), mesh.rand(63, sum(counts), D, dtype=dtype)
    start = sum(counts[:r])
    x_l, g_l = _leaf(tokens[start:start + counts[r]]), g[start:start + counts[r]]
    w_l = _leaf(experts[r])
    st.assert_type(x_l, {mesh.tp: st.S(0)})
    st.assert_type(g_l, {mesh.tp: st.S(0)})
    st.assert_type(w_l, {mesh.tp: st.V})
    splits = {}
    if uneven:
        splits = {"input_split_sizes": sends[r], "output_split_sizes": [sends[s][r] for s in range(tp)]}
    arrived = C.all_to_all(x_l, mesh.tp, src=st.S(0), dst=st.S(0), **splits, **_wire(dtype))
    processed = F.gelu(arrived @ w_l)
    back_splits = ({"input_split_sizes": splits["output_split_sizes"],
                    "output_split_sizes": splits["input_split_sizes"]} if uneven else {})
    y = C.all_to_all(processed, mesh.tp, src=st.S(0), dst=st.S(0), **back_splits, **_wire(dtype))
    st.reinterpret((y * g_l).sum(), mesh.tp, src=st.V, dst=st.P).backward()

    def ref(tokens, experts):
        pieces, offset = [], 0
        for s in range(tp):
            for e in range(tp):
                n = sends[s][e]
                pieces.append(F.gelu(tokens[offset:offset + n] @ experts[e]))
                offset += n
        y = torch.cat(pieces)
        return (y * g.double()).sum(), y

    y_ref, grads = _reference(ref, tokens=tokens, experts=experts)
    return [
        Check("tokens back from the experts (this rank's tokens)", y, y_ref[start:start + counts[r]]),
        Check("grad of this rank's tokens", x_l.grad, grads["tokens"][start:start + counts[r]]),
        Check("grad of this rank's expert weight", w_l.grad, grads["experts"][r]),
    ]


def program_expert_parallel_even(mesh, C, dtype):
    """Expert-parallel round trip: all_to_all with equal splits, an expert per rank, the inverse all_to_all."""
    return _expert_parallel(mesh, C, dtype, uneven=False)


def program_expert_parallel_uneven(mesh, C, dtype):
    """Expert-parallel round trip with uneven split sizes (rank s sends s + e + 1 tokens to expert e)."""
    return _expert_parallel(mesh, C, dtype, uneven=True)


def _partial_algebra(mesh: Mesh, C, dtype, expression: str) -> list[Check]:
    """Each rank holds a_r, b_r (V); P = reinterpret(V -> P) stands for the sum over ranks."""
    import spmd_types as st

    tp, r = mesh.tp_size, mesh.tp_index
    a_all, b_all = mesh.rand(71, tp, 3, 4, dtype=dtype), mesh.rand(72, tp, 3, 4, dtype=dtype)
    c, g = mesh.rand(73, 3, 4, dtype=dtype), mesh.rand(74, 3, 4, dtype=dtype)
    a_l, b_l, c_l = _leaf(a_all[r]), _leaf(b_all[r]), _leaf(c)
    st.assert_type(a_l, {mesh.tp: st.V})
    st.assert_type(b_l, {mesh.tp: st.V})
    st.assert_type(c_l, {mesh.tp: st.R})
    pa = st.reinterpret(a_l, mesh.tp, src=st.V, dst=st.P)
    pb = st.reinterpret(b_l, mesh.tp, src=st.V, dst=st.P)
    g_typed = g.clone()
    st.assert_type(g_typed, {mesh.tp: st.I})
    ops = {
        "P+P": (lambda: pa + pb, lambda A, B, c: A + B),
        "P*R": (lambda: pa * c_l, lambda A, B, c: A * c),
        "P*2.0": (lambda: pa * 2.0, lambda A, B, c: A * 2.0),
        "sum(P)": (lambda: pa.sum(dim=0), lambda A, B, c: A.sum(dim=0)),
    }
    typed, plain = ops[expression]
    out = C.all_reduce(typed(), mesh.tp, src=st.P, dst=st.I, **_wire(dtype))
    gg = g_typed[0] if expression == "sum(P)" else g_typed
    (out * gg).sum().backward()

    def ref(a, b, c):
        y = plain(a, b, c)
        return (y * (g.double()[0] if expression == "sum(P)" else g.double())).sum(), y

    # d(global)/d(a_r) is the identity, so every rank's a.grad is the reference grad of the sum A.
    y_ref, grads = _reference(ref, a=a_all.double().sum(0), b=b_all.double().sum(0), c=c)
    checks = [Check(f"{expression} after all_reduce(P -> I)", out, y_ref),
              Check("grad of a_r (V, read as one term of P)", a_l.grad, grads["a"])]
    if expression == "P*R":
        checks.append(Check("grad of the R factor (Partial: sums over ranks to the reference)", c_l.grad,
                            grads["c"], summed_over=tuple(range(tp))))
    return checks


def program_regulariser(mesh: Mesh, C, dtype) -> list[Check]:
    """Partial data loss + convert(reg, R -> P): the regulariser's gradient is counted once, not once per rank."""
    import spmd_types as st

    tp, r, lam = mesh.tp_size, mesh.tp_index, 0.5
    x, t, w = mesh.rand(81, 4 * tp, D, dtype=dtype), mesh.rand(82, 4 * tp, 2, dtype=dtype), mesh.rand(83, D, 2, dtype=dtype)
    x_l, t_l, w_l = x.chunk(tp, 0)[r], t.chunk(tp, 0)[r], _leaf(w)
    st.assert_type(x_l, {mesh.tp: st.V})
    st.assert_type(t_l, {mesh.tp: st.V})
    st.assert_type(w_l, {mesh.tp: st.R})
    data = st.reinterpret(((x_l @ w_l - t_l) ** 2).sum(), mesh.tp, src=st.V, dst=st.P)
    reg = st.convert(lam * (w_l ** 2).sum(), mesh.tp, src=st.R, dst=st.P, **_wire(dtype))
    total = data + reg
    total.backward()
    reduced_total = C.all_reduce(total.detach(), mesh.tp, src=st.P, dst=st.I, **_wire(dtype))

    def ref(w):
        loss = ((x.double() @ w - t.double()) ** 2).sum() + lam * (w ** 2).sum()
        return loss, loss

    loss_ref, grads = _reference(ref, w=w)
    return [
        Check("total loss after all_reduce(P -> I) (regulariser counted once)", reduced_total, loss_ref),
        Check("grad of w (R: partial gradients sum to the reference, regulariser counted once)", w_l.grad,
              grads["w"], summed_over=tuple(range(tp))),
    ]


def program_missing_f_unchecked(mesh: Mesh, C, dtype) -> list[Check]:
    """The TP MLP without f (no invariant_to_replicate), checker off: x's gradient must come out wrong.

    This is the bug the checker's rejection of the same program prevents; if this gradient were
    right, the rejection test would prove nothing.
    """
    import torch.nn.functional as F

    H, tp, r = 4 * mesh.tp_size, mesh.tp_size, mesh.tp_index
    x, w1, w2, g = mesh.rand(1, B, D, dtype=dtype), mesh.rand(2, H, D, dtype=dtype), mesh.rand(3, D, H, dtype=dtype), \
        mesh.rand(4, B, D, dtype=dtype)
    x_l, w1_l, w2_l = _leaf(x), _leaf(w1.chunk(tp, 0)[r]), _leaf(w2.chunk(tp, 1)[r])
    import spmd_types as st

    y = C.all_reduce(F.linear(F.gelu(F.linear(x_l, w1_l)), w2_l), mesh.tp, src=st.P, dst=st.I, **_wire(dtype))
    (y * g).sum().backward()

    def ref(x, w1, w2):
        y = F.linear(F.gelu(F.linear(x, w1)), w2)
        return (y * g.double()).sum(), y

    y_ref, grads = _reference(ref, x=x, w1=w1, w2=w2)
    return [
        Check("output y (forward is still right without f)", y, y_ref),
        Check("grad of x without f (only this rank's share: must differ from the reference)", x_l.grad,
              grads["x"], must_differ=True),
    ]


PROGRAMS: dict[str, Callable] = {
    "tp_mlp": program_tp_mlp,
    "sequence_parallel_gamma_R": program_sequence_parallel_gamma_R,
    "sequence_parallel_gamma_I": program_sequence_parallel_gamma_I,
    "data_parallel_weight_R": program_data_parallel_weight_R,
    "data_parallel_weight_I": program_data_parallel_weight_I,
    "fsdp": program_fsdp,
    "context_parallel_attention": program_context_parallel_attention,
    "vocab_parallel_cross_entropy": program_vocab_parallel_cross_entropy,
    "expert_parallel_even": program_expert_parallel_even,
    "expert_parallel_uneven": program_expert_parallel_uneven,
    **{f"partial_algebra_{e}": (lambda e: lambda mesh, C, dtype: _partial_algebra(mesh, C, dtype, e))(e)
       for e in ("P+P", "P*R", "P*2.0", "sum(P)")},
    "regulariser": program_regulariser,
    "missing_f_unchecked": program_missing_f_unchecked,
}
UNCHECKED = {"missing_f_unchecked"}  # run without spmd-types' checker, on purpose
MESH_PROGRAMS = {"tp_mlp", "sequence_parallel_gamma_R", "sequence_parallel_gamma_I",
                 "data_parallel_weight_R", "data_parallel_weight_I"}  # programs that also run on the dp x tp mesh


def run_program(ctx, name: str, dtype_name: str, impl: str = "torch", mesh: str = "1d") -> list[Check]:
    """Rank function: run one accepted program under the checker; its Check records."""
    import contextlib

    from spmd_types.checker import typecheck

    from conformance.suites._collective_impls import resolve

    collectives = resolve(impl)
    checker = contextlib.nullcontext() if name in UNCHECKED else typecheck()
    with checker:
        return PROGRAMS[name](_mesh(ctx, mesh), collectives, _dtype(dtype_name))


# -- rejected programs ----------------------------------------------------------------------------
# Each builds the typed inputs and does the one wrong thing; (program, error type, message parts).

def _typed(mesh: Mesh, t, shape=(3, 4), seed=90):
    import spmd_types as st

    tensor = _leaf(mesh.rand(seed, *shape))
    if t == "P":
        st.assert_type(tensor, {mesh.tp: st.V})
        return st.reinterpret(tensor, mesh.tp, src=st.V, dst=st.P)
    st.assert_type(tensor, {mesh.tp: getattr(st, t)})
    return tensor


def _reject_missing_f(mesh, C):
    import torch.nn.functional as F

    x = _typed(mesh, "I", (B, D))
    w1 = _typed(mesh, "V", (4, D), seed=91)
    return F.linear(x, w1)  # x is I: without f (invariant_to_replicate) it cannot meet the V weight


def _reject_data_parallel_weight_I(mesh, C):
    x, w = _typed(mesh, "V", (B, D)), _typed(mesh, "I", (D, 3), seed=91)
    return x @ w


def _reject_missing_g_nonlinear(mesh, C):
    import torch.nn.functional as F
    import spmd_types as st

    h, w2 = _typed(mesh, "R", (B, 4)), _typed(mesh, "V", (D, 4), seed=91)
    partial = st.reinterpret(F.linear(h, w2), mesh.tp, src=st.V, dst=st.P)
    return F.gelu(partial)  # the row-parallel output is Partial: g (all_reduce) must come first


def _reject_residual(kind):
    def program(mesh, C):
        return _typed(mesh, "P") + _typed(mesh, kind, seed=91)
    return program


def _reject_vocab_parallel_dst_R(mesh, C):
    import torch
    import torch.nn.functional as F
    import spmd_types as st

    logits = _leaf(mesh.rand(51, B, 5 * mesh.tp_size).chunk(mesh.tp_size, -1)[mesh.tp_index])
    st.assert_type(logits, {mesh.tp: st.S(-1)})
    target = torch.tensor([0, 1, 2, 3], device=mesh.device)
    st.assert_type(target, {mesh.tp: st.I})
    full = C.all_gather(logits, mesh.tp, src=st.S(-1), dst=st.R)
    F.cross_entropy(full, target).backward()


def _misuse(kind):
    """Misused collectives and conversions: each names a type the operation cannot take."""
    def program(mesh, C):
        import spmd_types as st

        if kind == "all_gather_V_on_R":  # an R tensor passed where all_gather expects V
            return C.all_gather(_typed(mesh, "R"), mesh.tp, src=st.V, dst=st.R)
        if kind == "all_gather_src_R":
            return C.all_gather(_typed(mesh, "R"), mesh.tp, src=st.R, dst=st.R)
        if kind == "all_reduce_src_I":
            return C.all_reduce(_typed(mesh, "I"), mesh.tp, src=st.I, dst=st.I)
        return st.convert(_typed(mesh, "P"), mesh.tp, src=st.P, dst=st.R)
    return program


REJECTED: dict[str, tuple[Callable, str, tuple[str, ...]]] = {
    "partial_plus_scalar": (lambda mesh, C: _typed(mesh, "P") + 1.0, "SpmdTypeError",
                            ("Partial", "requires all operands to be Partial", "[P, Scalar]")),
    "partial_matmul_partial": (lambda mesh, C: _typed(mesh, "P") @ _typed(mesh, "P", seed=91).T, "SpmdTypeError",
                               ("Partial in multiple factors", "[P, P]")),
    "partial_plus_varying": (_reject_residual("V"), "SpmdTypeError",
                             ("Partial type", "cannot combine with Varying", "[P, V]")),
    "exp_of_partial": (lambda mesh, C: _typed(mesh, "P").exp(), "SpmdTypeError",
                       ("Partial type", "non-linear ops", "all_reduce")),
    "replicate_div_partial": (lambda mesh, C: _typed(mesh, "R") / _typed(mesh, "P", seed=91), "SpmdTypeError",
                              ("div", "Partial type in nonlinear argument")),
    "missing_f": (_reject_missing_f, "SpmdTypeError",
                  ("Invariant type", "cannot mix with other types", "[I, V]", "src=I, dst=R")),
    "missing_g_nonlinear": (_reject_missing_g_nonlinear, "SpmdTypeError",
                            ("Partial type", "non-linear ops", "Found types: [P]")),
    "missing_g_replicate_residual": (_reject_residual("R"), "SpmdTypeError",
                                     ("Partial", "requires all operands to be Partial", "[P, R]")),
    "missing_g_invariant_residual": (_reject_residual("I"), "SpmdTypeError",
                                     ("Invariant type", "cannot mix", "[P, I]")),
    "data_parallel_weight_I_unconverted": (_reject_data_parallel_weight_I, "SpmdTypeError",
                                           ("Invariant type", "cannot mix with other types", "[V, I]")),
    "vocab_parallel_dst_R_backward": (_reject_vocab_parallel_dst_R, "SpmdTypeError",
                                      ("backward() on a Replicate loss",)),
    "all_gather_replicate_input": (_misuse("all_gather_V_on_R"), "SpmdTypeError",
                                   ("all_gather", "expected input type", "got PerMeshAxisLocalSpmdType.R")),
    "all_gather_src_R": (_misuse("all_gather_src_R"), "ValueError", ("all_gather src must be V or S(i)",)),
    "all_reduce_src_I": (_misuse("all_reduce_src_I"), "ValueError", ("all_reduce src must be P", "usually a bug")),
    "convert_partial_to_replicate": (_misuse("convert_P_R"), "ValueError",
                                     ("is not supported", "Use all_reduce(src=P")),
}


def run_rejected(ctx, name: str, impl: str = "torch") -> str | None:
    """Rank function: run one program the checker must refuse; ``"Type: message"``, or None if it ran."""
    from spmd_types.checker import typecheck

    from conformance.suites._collective_impls import resolve

    program = REJECTED[name][0]
    try:
        with typecheck():
            program(_mesh(ctx, "1d"), resolve(impl))
    except Exception as exc:  # the error is the result; its type and text are checked by the caller
        return f"{type(exc).__name__}: {exc}"
    return None


# -- typed collective primitives ------------------------------------------------------------------
# Each collective in isolation: forward against its spec, and the gradient of the summed loss
# L = sum over ranks of <out_r, w_r> (w_r differs per rank; one shared w when the output is I).

PRIMITIVES = ["all_reduce(P->R)", "all_reduce(P->I)", "all_gather(S(0)->R)", "all_gather(S(0)->I)",
              "reduce_scatter(P->S(0))", "all_to_all(S(0)->S(1))"]


def run_primitive(ctx, name: str, dtype_name: str, impl: str = "torch") -> list[Check]:
    """Rank function: one typed collective, forward and backward, against its spec (exact: small integers)."""
    import torch
    from spmd_types.checker import typecheck
    import spmd_types as st

    from conformance.suites._collective_impls import resolve

    C, dtype, world, r = resolve(impl), _dtype(dtype_name), ctx.world_size, ctx.rank
    axis = ctx.group
    xs = [_rand(100 + s, 2 * world, 2 * world, dtype=dtype, integers=True, device=ctx.device) for s in range(world)]
    to_invariant = name.endswith("->I)")
    ws = [_rand(200 + (0 if to_invariant else s), *_out_shape(name, world), dtype=dtype, integers=True, device=ctx.device)
          for s in range(world)]
    x = _leaf(xs[r])
    with typecheck():
        if name.startswith("all_reduce"):
            st.assert_type(x, {axis: st.V})
            out = C.all_reduce(st.reinterpret(x, axis, src=st.V, dst=st.P), axis, src=st.P,
                               dst=st.I if to_invariant else st.R, **_wire(dtype))
            expected, grad = sum(xs), (ws[0] if to_invariant else sum(ws))
        elif name.startswith("all_gather"):
            st.assert_type(x, {axis: st.S(0)})
            out = C.all_gather(x, axis, src=st.S(0), dst=st.I if to_invariant else st.R, **_wire(dtype))
            expected = torch.cat(xs)
            grad = (ws[0] if to_invariant else sum(ws)).chunk(world, 0)[r]
        elif name.startswith("reduce_scatter"):
            st.assert_type(x, {axis: st.V})
            out = C.reduce_scatter(st.reinterpret(x, axis, src=st.V, dst=st.P), axis, src=st.P, dst=st.S(0), **_wire(dtype))
            expected, grad = sum(xs).chunk(world, 0)[r], torch.cat(ws)
        else:
            st.assert_type(x, {axis: st.S(0)})
            out = C.all_to_all(x, axis, src=st.S(0), dst=st.S(1), **_wire(dtype))
            expected = torch.cat(xs).chunk(world, 1)[r]
            grad = torch.cat(ws, 1).chunk(world, 0)[r]
        w = ws[r].clone()
        st.assert_type(w, {axis: st.I if to_invariant else st.V})
        loss = (out * w).sum()
        (loss if to_invariant else st.reinterpret(loss, axis, src=st.V, dst=st.P)).backward()
    return [Check("forward", out, expected, exact=True), Check("backward (gradient of the input)", x.grad, grad,
                                                                exact=True)]


def _out_shape(name: str, world: int) -> tuple[int, ...]:
    """Each rank's input is [2w, 2w]; the shape of its output."""
    if name.startswith("all_reduce"):
        return (2 * world, 2 * world)
    if name.startswith("all_gather"):
        return (2 * world * world, 2 * world)
    if name.startswith("reduce_scatter"):
        return (2, 2 * world)
    return (2 * world * world, 2)  # all_to_all S(0)->S(1): the rows of every rank, this rank's 2 columns


# -- raw functional collectives -------------------------------------------------------------------

RAW_COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def run_raw_collective(ctx, name: str, dtype_name: str, impl: str = "torch") -> list[Check]:
    """Rank function: one functional collective with autograd, forward and backward, against its spec.

    The loss is L = sum over ranks of <out_r, w_r>, so each input's gradient is what the collective's
    backward must deliver: all_reduce -> sum of w; all_gather -> this rank's rows of the sum of w;
    reduce_scatter -> the concatenation of w; all_to_all -> the inverse exchange of w.
    """
    import torch

    from conformance.suites._collective_impls import resolve

    C, dtype, world, r, group = resolve(impl), _dtype(dtype_name), ctx.world_size, ctx.rank, ctx.group
    if name == "all_to_all":
        # Uneven: rank s sends s + d + 1 rows to rank d.
        sizes = [[s + d + 1 for d in range(world)] for s in range(world)]
        xs = [_rand(300 + s, sum(sizes[s]), 3, dtype=dtype, integers=True, device=ctx.device) for s in range(world)]
        received = [sum(sizes[s][d] for s in range(world)) for d in range(world)]
        ws = [_rand(400 + d, received[d], 3, dtype=dtype, integers=True, device=ctx.device) for d in range(world)]
        x = _leaf(xs[r])
        out = C.raw_all_to_all(x, [sizes[s][r] for s in range(world)], sizes[r], group)

        def piece(tensors, owner, index, counts):
            start = sum(counts[:index])
            return tensors[owner][start:start + counts[index]]

        expected = torch.cat([piece(xs, s, r, sizes[s]) for s in range(world)])
        recv_counts = lambda d: [sizes[s][d] for s in range(world)]  # noqa: E731
        grad = torch.cat([piece(ws, d, r, recv_counts(d)) for d in range(world)])
    else:
        rows = {"all_reduce": 4, "all_gather": 2, "reduce_scatter": 2 * world}[name]
        out_rows = {"all_reduce": 4, "all_gather": 2 * world, "reduce_scatter": 2}[name]
        xs = [_rand(300 + s, rows, 3, dtype=dtype, integers=True, device=ctx.device) for s in range(world)]
        ws = [_rand(400 + s, out_rows, 3, dtype=dtype, integers=True, device=ctx.device) for s in range(world)]
        x = _leaf(xs[r])
        if name == "all_reduce":
            out, expected, grad = C.raw_all_reduce(x, group), sum(xs), sum(ws)
        elif name == "all_gather":
            out, expected, grad = C.raw_all_gather(x, group), torch.cat(xs), sum(ws).chunk(world, 0)[r]
        else:
            out, expected, grad = C.raw_reduce_scatter(x, group), sum(xs).chunk(world, 0)[r], torch.cat(ws)
    (out * ws[r]).sum().backward()
    return [Check("forward", out, expected, exact=True),
            Check("backward (gradient of the input)", x.grad, grad, exact=True)]
