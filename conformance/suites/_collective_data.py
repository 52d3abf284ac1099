"""Inputs and expected values of the collectives suites, computed the same way on ranks and controller.

Every input is a pure function of (salt, rank, size, dtype): a rank builds its own on its device, the
controller builds every rank's on CPU to compute what the collective must give. Values come from a
generator seeded per (salt, rank), so no two ranks hold the same data and nothing repeats with a
period across ranks (a collective that puts rank i's data in rank j's slot cannot come out right).

* ``payload``: for data movement. Random bytes viewed as the dtype (every bit pattern: NaN payloads,
  subnormals, negative zero), led by the dtype's edge values; compared bit for bit (``same_bits``).
* ``reduce_input``: for reductions. Integer-valued numbers small enough that SUM/PRODUCT of up to
  eight ranks is exact in every dtype (bf16 included), so every reduction but AVG is compared exactly.
* ``expected_reduction``: what a reduction of those inputs must give, computed locally.
"""

from __future__ import annotations

import functools
import zlib

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
SIGNED_DTYPES = ("int8", "int16", "int32", "int64")
UNSIGNED_DTYPES = ("uint8", "uint16", "uint32", "uint64")
INT_DTYPES = SIGNED_DTYPES + UNSIGNED_DTYPES
COMPLEX_DTYPES = ("complex64", "complex128")
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
# Data movement must carry every dtype torch has a distributed type for.
MOVEMENT_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",) + COMPLEX_DTYPES + FLOAT8_DTYPES

ARITHMETIC_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
BITWISE_OPS = ("BAND", "BOR", "BXOR")
PREMUL_FACTOR = 2.0


def op_dtypes(op: str) -> tuple[str, ...]:
    """The dtypes torch defines reduction ``op`` for (complex: SUM, AVG and PREMUL_SUM only)."""
    if op == "PREMUL_SUM":
        return FLOAT_DTYPES + COMPLEX_DTYPES
    if op in BITWISE_OPS:
        return INT_DTYPES + ("bool",)
    numbers = FLOAT_DTYPES + INT_DTYPES
    if op == "AVG":
        return numbers + COMPLEX_DTYPES
    if op == "SUM":
        return numbers + ("bool",) + COMPLEX_DTYPES
    return numbers + ("bool",)  # PRODUCT, MIN, MAX


def reduce_cases() -> list[tuple[str, str]]:
    return [(op, dtype) for op in ARITHMETIC_OPS + BITWISE_OPS for dtype in op_dtypes(op)]


# One dtype per family: with every op, they cover the arithmetic; every dtype meets at least one op.
FAMILY_DTYPES = ("float32", "bfloat16", "int64", "uint8", "bool", "complex64")


def paired_reduce_cases() -> list[tuple[str, str]]:
    """A lean cover of ``reduce_cases`` for the collectives that share all_reduce's arithmetic (reduce,
    reduce_scatter): every op with one dtype per family, and every dtype with SUM (MAX for bool's
    sake too) -- pairs, not the full product, which all_reduce alone runs."""
    cases = [(op, d) for op in ARITHMETIC_OPS + BITWISE_OPS for d in FAMILY_DTYPES if d in op_dtypes(op)]
    cases += [(op, d) for op in ("SUM", "MAX") for d in op_dtypes(op) if (op, d) not in cases]
    return cases


def undefined_cases() -> list[tuple[str, str]]:
    """(op, dtype) pairs torch does not define: a backend must raise, never return garbage."""
    out = [(op, dtype) for op in BITWISE_OPS for dtype in FLOAT_DTYPES]
    out += [(op, dtype) for op in ("MIN", "MAX", "PRODUCT") for dtype in COMPLEX_DTYPES]
    return out


def dtype_of(name: str):
    import torch

    return getattr(torch, name)


def _on_host(fn):
    """Inputs are drawn on the host, the same bits whatever the device (and whatever a rank's default
    device is); rank functions move them to ``ctx.device``."""
    @functools.wraps(fn)
    def on_host(*args, **kwargs):
        import torch

        with torch.device("cpu"):
            return fn(*args, **kwargs)
    return on_host


def _generator(salt: str, rank: int):
    import torch

    return torch.Generator().manual_seed(zlib.crc32(f"{salt}/{rank}".encode()))


@_on_host
def edge_values(dtype_name: str):
    """The dtype's edge values as a CPU tensor: largest finite, smallest normal and subnormal, signed
    zeros, infinities and NaNs with payloads (floats); min, max, 0, -1 (integers)."""
    import torch

    dtype = dtype_of(dtype_name)
    if dtype == torch.bool:
        return torch.tensor([True, False])
    if dtype.is_complex:
        real = edge_values("float32" if dtype == torch.complex64 else "float64")
        return torch.complex(real, real.flip(0))
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        values = torch.tensor([info.max, -info.max, info.tiny, -info.tiny, -0.0, 0.0, float("inf"),
                               float("-inf"), float("nan")], dtype=torch.float64).to(dtype)
        # By bit pattern: the smallest subnormal (bits 1) of both signs, NaNs with payloads.
        bits_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
        sign = torch.iinfo(bits_dtype).min
        nan = values[-1:].view(bits_dtype)
        by_bits = torch.cat([torch.tensor([1, sign | 1], dtype=bits_dtype), nan | 1, nan | 5, (nan | 3) | sign])
        return torch.cat([values, by_bits.view(dtype)])
    info = torch.iinfo(dtype)
    values = [info.min, info.max, 0, 1] + ([-1] if info.min < 0 else [])
    return torch.tensor(values, dtype=dtype)


@_on_host
def payload(salt: str, rank: int, numel: int, dtype_name: str):
    """Rank ``rank``'s data-movement input: ``numel`` elements of every bit pattern (CPU)."""
    import torch

    dtype, gen = dtype_of(dtype_name), _generator(salt, rank)
    if dtype == torch.bool:
        random = torch.randint(0, 2, (numel,), generator=gen).bool()
    else:
        random = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen).view(dtype)
    edges = edge_values(dtype_name)
    edges = edges.roll(rank % max(len(edges), 1))[: numel]
    return torch.cat([edges, random[len(edges):]]) if numel else random


def unwritten(numel: int, dtype, device):
    """An output buffer for a collective to fill: every byte 0xA5 (bool: all False). Never
    ``torch.empty``: a caching allocator hands back the block an identical call just freed, still
    holding the expected bytes, and an output the collective never wrote would pass."""
    import torch

    dtype = dtype_of(dtype) if isinstance(dtype, str) else dtype
    if dtype == torch.bool:
        return torch.zeros(numel, dtype=dtype, device=device)
    out = torch.empty(numel, dtype=dtype, device=device)
    out.view(torch.uint8).fill_(0xA5)
    return out


def unwritten_like(tensor):
    return unwritten(tensor.numel(), tensor.dtype, tensor.device).view(tensor.shape)


@_on_host
def reduce_input(salt: str, rank: int, numel: int, dtype_name: str, op: str):
    """Rank ``rank``'s input to reduction ``op``: integer values that reduce exactly (CPU)."""
    import torch

    dtype, gen = dtype_of(dtype_name), _generator(f"{salt}/{op}", rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    unsigned = dtype_name.startswith("uint")
    if op == "PRODUCT":
        magnitude = 2 ** torch.randint(0, 2, (numel,), generator=gen)
        sign = 1 if unsigned else torch.randint(0, 2, (numel,), generator=gen) * 2 - 1
        values = magnitude * sign
    else:
        values = torch.randint(0 if unsigned else -15, 16, (numel,), generator=gen)
    if dtype.is_complex:
        imag = torch.randint(-15, 16, (numel,), generator=gen)
        return torch.complex(values.double(), imag.double()).to(dtype)
    return values.to(dtype)


def expected_reduction(op: str, inputs: list):
    """What reduction ``op`` over ``inputs`` (one per rank) must give, computed locally."""
    import torch

    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return stacked.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stacked.all(0)
        return functools.reduce(torch.bitwise_xor, inputs)
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([t.to(wide) for t in inputs])
    if op == "SUM":
        result = stacked.sum(0)
    elif op == "PRODUCT":
        result = stacked.prod(0)
    elif op == "MIN":
        result = stacked.min(0).values
    elif op == "MAX":
        result = stacked.max(0).values
    elif op == "AVG":
        result = stacked.sum(0) / len(inputs) if wide != torch.int64 else \
            torch.div(stacked.sum(0), len(inputs), rounding_mode="trunc")
    elif op == "PREMUL_SUM":
        result = (stacked * PREMUL_FACTOR).sum(0)
    else:
        bitwise = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        result = functools.reduce(bitwise, list(stacked))
    return result.to(dtype)


def reduction_is_exact(op: str) -> bool:
    """Every reduction of ``reduce_input`` values is exact except AVG (a division)."""
    return op != "AVG"


def same_bits(actual, expected) -> str | None:
    """None when the tensors have the same dtype, shape and bytes; else what differs (first element)."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.numel() == 0:
        return None
    width = actual.element_size()
    got = actual.contiguous().reshape(-1).view(dtype_of("uint8")).view(-1, width)
    want = expected.contiguous().reshape(-1).view(dtype_of("uint8")).view(-1, width)
    differ = (got != want).any(1)
    if not bool(differ.any()):
        return None
    first = int(differ.nonzero()[0])
    return (f"{int(differ.sum())} of {actual.numel()} elements differ bitwise, first at flat index {first}: "
            f"got bytes {bytes(got[first].tolist()).hex()} ({_show(actual, first)}), expected "
            f"{bytes(want[first].tolist()).hex()} ({_show(expected, first)})")


def _show(tensor, index: int) -> str:
    try:
        return repr(tensor.reshape(-1)[index].item())
    except (RuntimeError, TypeError):  # float8 has no Python scalar conversion on some builds
        return repr(tensor.reshape(-1)[index].float().item())


# -- carrying results home --------------------------------------------------------------------------
# torch 2.13 cannot unpickle tensors of some dtypes ("'UntypedStorage' has no attribute 'dtype'"), and
# results travel from the ranks by pickle: ranks send those tensors as their bytes, tagged with the
# dtype, and the controller views the bytes as the dtype again.
UNPICKLABLE = ("uint16", "uint32", "uint64") + FLOAT8_DTYPES
_BYTES_TAG = "conformance-tensor-bytes"


def pack(value):
    """Rank side: ``value`` with every tensor of an UNPICKLABLE dtype replaced by its tagged bytes."""
    import torch

    if isinstance(value, torch.Tensor) and str(value.dtype).removeprefix("torch.") in UNPICKLABLE:
        flat = value.detach().cpu().contiguous()
        return (_BYTES_TAG, str(value.dtype).removeprefix("torch."), tuple(flat.shape), flat.reshape(-1).view(torch.uint8))
    if isinstance(value, (list, tuple)):
        return type(value)(pack(v) for v in value)
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    return value


def unpack(value):
    """Controller side: the inverse of ``pack``."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == _BYTES_TAG:
        _, dtype, shape, raw = value
        return raw.view(dtype_of(dtype)).reshape(shape)
    if isinstance(value, (list, tuple)):
        return type(value)(unpack(v) for v in value)
    if isinstance(value, dict):
        return {k: unpack(v) for k, v in value.items()}
    return value


def packed(fn):
    """Decorator for a rank function whose results may hold tensors of an UNPICKLABLE dtype."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return pack(fn(*args, **kwargs))

    return wrapper


def run_packed(ranks, fn, *args, **kwargs) -> list:
    """``ranks.run`` for a ``packed`` rank function: results with their tensors restored."""
    __tracebackhide__ = True  # noqa: F841 - a failure's traceback ends at the suite's call
    return unpack(ranks.run(fn, *args, **kwargs))
