"""How many 32-bit draws a recorded random op takes from the CPU generator.

Knowing the count lets replay jump over an op (`mt19937.jump_state`) instead of running it. Counts
follow the CPU kernels (aten/src/ATen/native/cpu/DistributionTemplates.h, DistributionKernels.cpp,
aten/src/ATen/core/DistributionsHelper.h): `uniform_real_distribution<double>` and 64-bit integer
ranges take two draws per element, everything narrower one; `normal_` on a contiguous tensor of at
least 16 elements fills uniforms, transforms them in blocks of 16 and, when the size is not a
multiple of 16, draws 16 more for the recomputed tail. Smaller or strided `normal_` reads and writes
the generator's cached normal sample, so its count depends on the state: unknown here.

Note: [Draw counts are calibrated] Kernels differ by machine (on Intel CPUs with MKL, `bernoulli_(p)`
seeds a VSL stream with a single draw) and may change between PyTorch versions. So every rule is
checked once per process, per dtype, against the real kernel on a private generator over sizes
around its block boundaries; a rule that does not match exactly is dropped and its ops are run on
scratch, as before. A wrong count can therefore cost time, never parity.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..graph import InitGraph, OpNode, TensorInfo
from .mt19937 import jump_state

Formula = Callable[[int, torch.dtype], "int | None"]  # (elements, dtype) → draws; None: not known


def _per_element(n: int, dtype: torch.dtype) -> int:
    return n * (2 if dtype == torch.float64 else 1)


def _two_per_element(n: int, dtype: torch.dtype) -> int:
    return 2 * n


def _wide_per_element(n: int, dtype: torch.dtype) -> int:
    return n * (2 if dtype in (torch.float64, torch.int64) else 1)


def _normal_tail_after_all(n: int, dtype: torch.dtype) -> int | None:
    """`normal_` drawing all n uniforms, then 16 more for a recomputed tail: float32 and float64 on
    every release, float16 and bfloat16 up to torch 2.12 (which filled them as float32 does)."""
    if n == 0:
        return 0
    if n < 16:
        return None  # the scalar path: uses the cached normal sample
    tail = 16 if n % 16 else 0
    return (2 if dtype == torch.float64 else 1) * (n + tail)


def _normal_half_blocks(n: int, dtype: torch.dtype) -> int | None:
    """`normal_` as torch 2.13 and later fill float16 / bfloat16: block by block, the tail's 16
    uniforms right after the whole blocks (measured); other dtypes as `_normal_tail_after_all`."""
    count = _normal_tail_after_all(n, dtype)
    if count is None or dtype not in (torch.float16, torch.bfloat16):
        return count
    return count - n % 16


@dataclass(frozen=True)
class Family:
    """Random ops sharing one CPU kernel: how to run it on a tensor, and candidate draw counts."""

    name: str
    fill: Callable[[torch.Tensor, torch.Generator], Any]
    formulas: tuple[Formula, ...]  # the first that matches the real kernel is used
    contiguous_only: bool = False


_UNIFORM = Family("uniform", lambda t, g: t.uniform_(generator=g), (_per_element,))
# Which of the two half-precision layouts this torch has is found by calibration (note [Draw counts
# are calibrated]), not by its version.
_NORMAL = Family(
    "normal",
    lambda t, g: t.normal_(generator=g),
    (_normal_half_blocks, _normal_tail_after_all),
    contiguous_only=True,
)
_RANDOM_FULL = Family("random", lambda t, g: t.random_(generator=g), (_wide_per_element,))
_RANDOM_NARROW = Family("random range < 2^32", lambda t, g: t.random_(0, 5, generator=g), (lambda n, d: n,))
_RANDOM_WIDE = Family("random range >= 2^32", lambda t, g: t.random_(0, 2**33, generator=g), (_two_per_element,))
_BERNOULLI_SCALAR = Family(
    "bernoulli(p)", lambda t, g: t.bernoulli_(0.5, generator=g), (_two_per_element, lambda n, d: 1)
)
_BERNOULLI_TENSOR = Family(
    "bernoulli(tensor)", lambda t, g: t.bernoulli_(torch.full_like(t, 0.5), generator=g), (_per_element,)
)
_EXPONENTIAL = Family("exponential", lambda t, g: t.exponential_(generator=g), (_two_per_element,))
_CAUCHY = Family("cauchy", lambda t, g: t.cauchy_(generator=g), (_two_per_element,))
_GEOMETRIC = Family("geometric", lambda t, g: t.geometric_(0.5, generator=g), (_two_per_element,))

# Every family with a draw-count rule (tests and the parallel fill's checks go through them all).
FAMILIES: tuple[Family, ...] = (
    _UNIFORM,
    _NORMAL,
    _RANDOM_FULL,
    _RANDOM_NARROW,
    _RANDOM_WIDE,
    _BERNOULLI_SCALAR,
    _BERNOULLI_TENSOR,
    _EXPONENTIAL,
    _CAUCHY,
    _GEOMETRIC,
)

_BY_PACKET = {
    "uniform_": _UNIFORM,
    "rand": _UNIFORM,
    "rand_like": _UNIFORM,
    "normal_": _NORMAL,
    "randn": _NORMAL,
    "randn_like": _NORMAL,
    "exponential_": _EXPONENTIAL,
    "cauchy_": _CAUCHY,
    "geometric_": _GEOMETRIC,
}

# Ranges whose draws per value depend on the dtype (torch 2.13, measured: 2 for int32, int64 and
# float64 from 2^28 on; 1 for float32 and bfloat16 at 2^28, 2 at 2^31), which calibration with
# random_(0, 5) and random_(0, 2^33) would not see: run on scratch.
_MIXED_RANGES = (2**28, 2**32)

# Sizes each rule is checked at: empty, one block of 16, just past it, odd, past a 32k grain size.
_CALIBRATION_SIZES = (0, 16, 17, 1023, 4099, 40003)


def argument_value(op: OpNode, name: str, default: Any = None) -> Any:
    """An argument of a recorded op by schema name (recorded calls omit defaulted ones)."""
    for position, argument in enumerate(op.func._schema.arguments):
        if argument.name == name:
            if argument.kwarg_only or position >= len(op.args):
                return op.kwargs.get(name, default)
            return op.args[position]
    return default


def _family(op: OpNode, graph: InitGraph, written: TensorInfo) -> Family | None:
    packet = op.func._overloadpacket.__name__
    overload = op.func._overloadname
    if packet in _BY_PACKET:
        return _BY_PACKET[packet]
    if packet == "normal" and overload in ("Tensor_float", "float_Tensor", "Tensor_Tensor", "float_float"):
        return _NORMAL  # normal_(0, 1) on the output, then mean and std applied
    if packet == "random_" and overload == "default":
        return _RANDOM_FULL
    if packet in ("randint", "randint_like") or packet == "random_" and overload in ("from", "to"):
        low = argument_value(op, "from", argument_value(op, "low", 0))
        high = argument_value(op, "to", argument_value(op, "high"))
        if not isinstance(low, int) or not isinstance(high, int) or _MIXED_RANGES[0] <= high - low < _MIXED_RANGES[1]:
            return None
        return _RANDOM_WIDE if high - low >= 2**32 else _RANDOM_NARROW
    if packet in ("bernoulli_", "bernoulli") and overload in ("float", "p"):
        return _BERNOULLI_SCALAR
    if packet == "bernoulli_" and overload == "Tensor" or packet == "bernoulli" and overload == "default":
        source = graph.tensors[op.inputs[-1]]
        return _BERNOULLI_TENSOR if source.dtype == written.dtype else None
    return None  # randperm, multinomial, log_normal_, poisson, ...: run on scratch


def is_contiguous(info: TensorInfo) -> bool:
    """Whether the recorded layout is the contiguous one for its shape."""
    expected = 1
    for size, stride in reversed(list(zip(info.shape, info.stride))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def written_tensor(graph: InitGraph, op: OpNode) -> TensorInfo:
    """The tensor a random op fills: `self` for in-place ops, the output for factories."""
    tid = op.output_ids[0] if op.output_ids else op.inputs[0]
    return graph.tensors[tid]


def family_of(graph: InitGraph, op: OpNode) -> Family | None:
    """The kernel family of a recorded random op (None: no draw-count rule for it)."""
    return _family(op, graph, written_tensor(graph, op)) if op.output_ids else None


# Note: [Draw counts by layout]
# A random op that fills its one fake `self` (`normal_`, `uniform_`: nearly every random op of a
# constructor) with plain other arguments draws a count that depends on nothing but the overload,
# those arguments and the layout, dtype and device of `self`. Counting a 7B Llama's 452 such ops
# one by one took milliseconds (every deferred_init after a dropped deferred model counts the draws
# it owes, record/rng_ledger.py); by that key they come from a few remembered answers.
_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})
# By id(op.func) (OpOverload hashes in Python), the overload kept in the value so the id stays its.
_COUNTS: dict[tuple, tuple[Any, int | None]] = {}
_COUNTS_REMEMBERED = 4096  # a bound, for programs that draw into endless layouts


def _count_key(graph: InitGraph, op: OpNode) -> tuple | None:
    """The memo key of `op`'s draw count (note [Draw counts by layout]), or None."""
    if op.kwargs or len(op.inputs) != 1 or op.output_ids != op.inputs:
        return None
    plain = _PLAIN_SCALARS
    for value in op.args[1:]:
        if type(value) not in plain:
            return None
    written = graph.tensors[op.inputs[0]]
    return (id(op.func), op.args[1:], written.shape, written.stride, written.dtype, written.device)


@functools.cache
def writes_out_argument(func: Any) -> bool:
    """Whether `func` is an `out=` variant: it may resize its `out` tensor, whose recorded layout is
    then the one before the op, not the one its draws filled (`torch.rand(20, 2, out=empty(0))`)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(argument.is_out for argument in schema.arguments)


def draw_count(graph: InitGraph, op: OpNode) -> int | None:
    """32-bit draws `op` takes from the CPU generator, or None when that is not known in advance."""
    if writes_out_argument(op.func):
        return None  # run on scratch, which resizes `out` as eager did
    key = _count_key(graph, op)
    if key is None:
        return _draw_count(graph, op)
    known = _COUNTS.get(key)
    if known is not None and known[0] is op.func:
        return known[1]
    count = _draw_count(graph, op)
    if len(_COUNTS) >= _COUNTS_REMEMBERED:
        _COUNTS.clear()
    _COUNTS[key] = (op.func, count)
    return count


def _draw_count(graph: InitGraph, op: OpNode) -> int | None:
    if not op.output_ids:
        return None
    written = written_tensor(graph, op)
    if written.device.type != "cpu":
        return None
    family = _family(op, graph, written)
    if family is None or (family.contiguous_only and not is_contiguous(written)):
        return None
    numel = 1
    for size in written.shape:
        numel *= size
    formula = calibrated_formula(family, written.dtype)
    return None if formula is None else formula(numel, written.dtype)


@functools.cache
def calibrated_formula(family: Family, dtype: torch.dtype) -> Formula | None:
    """The first of `family`'s formulas that matches the real CPU kernel for `dtype`, or None."""
    for formula in family.formulas:
        if all(_matches(family, formula, dtype, n) for n in _CALIBRATION_SIZES):
            return formula
    return None


def _matches(family: Family, formula: Formula, dtype: torch.dtype, n: int) -> bool:
    expected = formula(n, dtype)
    if expected is None:
        return True  # the formula claims nothing for this size
    generator = torch.Generator()
    generator.manual_seed(20261124 + n)
    torch.empty(3).uniform_(generator=generator)  # start mid-block
    before = generator.get_state()
    try:
        with torch.no_grad(), torch.inference_mode(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "to - 1 is out of bounds" for a float range
            family.fill(torch.empty(n, dtype=dtype), generator)
    except (RuntimeError, TypeError, ValueError):
        return False  # this dtype is not supported by the kernel: nothing to jump over
    return jump_state(before, expected).equal(generator.get_state())
