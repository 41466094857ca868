"""How far each recorded CUDA random op moves its generator's Philox offset, known in advance.

CUDA's default generator is Philox: its state is a seed and an offset (note [CUDA generator state
layout]). A random kernel reserves offsets for itself before it launches and never reads the state
again, so the state after op k is the state before it with the offset moved by an amount fixed by
the op's kernel, dtype, element count and the device's launch limits, never by values. Knowing the
amounts lets replay compute a late layer's state (`rng.RngStreams`) instead of re-running every
earlier random op on scratch; an op the model does not cover answers None and is re-run, as before.

Note: [Philox offset increments] Read from PyTorch's source and measured on an H100 (132 SMs, 2048
threads per SM) with torch 2.11 (tests/explorer/replay/data/: every row reproduced exactly):
- Distribution kernels (`distribution_nullary_kernel`, aten/src/ATen/native/cuda/
  DistributionTemplates.h: uniform_, normal_, random_, bernoulli_(p), exponential_, cauchy_,
  log_normal_, geometric_, and the factories built on them) launch blocks of 256 threads on
  grid = min(SMs * (max threads per SM // 256), ceil(n / 256)) blocks and reserve
  `calc_execution_policy`'s ((n - 1) // (256 * grid * unroll) + 1) * 4, where unroll is what one
  curand call yields per element type: 4 (curand_uniform4 / normal4 / curand4 as 32-bit values), 2
  (curand_uniform2_double / normal2_double for float64, or curand4 read as two 64-bit values:
  random_() on float64 and int64, random_(from, to) over a range of 2^28 or more).
- A tensor TensorIterator cannot index in 32 bits (more than 2^31 - 1 elements, or a byte offset past
  it) is split by `with_32bit_indexing`, halving its largest dimension until every piece fits; the
  kernel has reserved the whole tensor's increment before it recurses, and each piece reserves its
  own again. So a contiguous float32 128256 x 8192 `normal_` (4.2 GB) moves the offset by 3888 for
  the whole plus 1944 for each 525336576-element half: 7776, twice the formula. Measured for dense
  layouts only (a transposed one included); a non-dense tensor that needs splitting is not covered.
- Fused dropout (`native_dropout`, aten/src/ATen/native/cuda/Dropout.cu) reserves the same formula
  with UNROLL = 4 for every dtype and never splits (it indexes in 64 bits instead); nothing when
  `train` is False or p == 1.
- `bernoulli_(Tensor p)` reserves a fixed 10, which `CUDAGeneratorState::increase` rounds up to a
  multiple of 4: 12, whatever the size.
Ops not listed (randperm, multinomial, poisson, trunc_normal_'s rejection sampling on 2.13+,
complex dtypes) answer None. This mirrors PyTorch internals: re-check on upgrades (the data files
and the probe rows in tests/explorer/replay/data/ say what was measured, on which release).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._torch_compat.dispatch import OpOverload
from .._torch_compat.generators import cuda_state, cuda_state_fields
from ..graph import InitGraph, OpNode
from .draws import argument_value, writes_out_argument, written_tensor

BLOCK = 256  # threads per block of every kernel modelled here
INT32_MAX = 2**31 - 1  # TensorIterator's 32-bit indexing limit, on elements and on byte offsets
BERNOULLI_TENSOR_INCREMENT = 12  # philox_cuda_state(10), rounded up to a multiple of 4

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# AT_ALL_TYPES plus Half, BFloat16 and Bool: what random_ dispatches over.
_RANDOM_DTYPES = _FLOATS | {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool}
_WIDE_RANGE = 1 << 28  # random_(from, to) draws 64-bit values from this range on


@dataclass(frozen=True)
class DeviceProperties:
    """The two launch limits the grid of a CUDA random kernel depends on."""

    multi_processor_count: int
    max_threads_per_multi_processor: int

    @property
    def max_grid(self) -> int:
        """Blocks of 256 threads a distribution kernel launches at most."""
        return self.multi_processor_count * (self.max_threads_per_multi_processor // BLOCK)


def device_properties(key: str) -> DeviceProperties | None:
    """The launch limits of CUDA device `key` ('cuda:1'), read from the device; None when it is not
    available here, or is not NVIDIA's (ROCm's kernels launch differently)."""
    if not key.startswith("cuda:") or torch.version.hip is not None or not torch.cuda.is_available():
        return None
    index = int(key.split(":")[1])
    if index >= torch.cuda.device_count():
        return None
    properties = torch.cuda.get_device_properties(index)
    count = getattr(properties, "multi_processor_count", None)
    threads = getattr(properties, "max_threads_per_multi_processor", None)
    return None if count is None or threads is None else DeviceProperties(count, threads)


Rule = Literal["grid_stride", "fused_dropout", "fixed"]


@dataclass(frozen=True)
class Kernel:
    """How one random op reserves Philox offsets: its rule, and values per curand call (unroll)."""

    rule: Rule
    unroll: int = 4


_aten = torch.ops.aten
# Ops whose kernel is the distribution kernel with curand_uniform4 / normal4 (float64: the 2-value
# double variants), over the tensor they write.
_FLOAT_FAMILIES: frozenset[OpOverload] = frozenset(
    {
        _aten.uniform_.default,
        _aten.rand.default,
        _aten.rand_like.default,
        _aten.normal_.default,
        _aten.randn.default,
        _aten.randn_like.default,
        _aten.normal.Tensor_float,
        _aten.normal.float_Tensor,
        _aten.normal.Tensor_Tensor,
        _aten.normal.float_float,
        _aten.log_normal_.default,
        _aten.exponential_.default,
        _aten.cauchy_.default,
        _aten.geometric_.default,
        _aten.bernoulli_.float,
        _aten.bernoulli.p,
    }
)
# Ops drawing integers over [from, to): the range picks 32- or 64-bit values (random_from_to_kernel).
_RANGED = {
    getattr(_aten.random_, "from"): ("from", "to"),
    _aten.random_.to: (None, "to"),
    _aten.randint.default: (None, "high"),
    _aten.randint.low: ("low", "high"),
    _aten.randint_like.default: (None, "high"),
    _aten.randint_like.low_dtype: ("low", "high"),
}
_BERNOULLI_TENSOR = frozenset({_aten.bernoulli_.Tensor, _aten.bernoulli.default, _aten.bernoulli.Tensor})


def kernel_of(op: OpOverload, dtype: torch.dtype, arguments: Mapping[str, Any]) -> Kernel | None:
    """The offset rule of `op` writing `dtype` (None: not covered; see note [Philox offset increments])."""
    if op in _FLOAT_FAMILIES:
        if dtype in _FLOATS:
            return Kernel("grid_stride", 2 if dtype == torch.float64 else 4)
        # geometric_ on integers transforms curand_uniform4's floats (measured: int32, int64)
        return Kernel("grid_stride") if op == _aten.geometric_.default and dtype in (torch.int32, torch.int64) else None
    if op == _aten.random_.default:
        wide = dtype in (torch.float64, torch.int64)
        return Kernel("grid_stride", 2 if wide else 4) if dtype in _RANDOM_DTYPES else None
    if op in _RANGED:
        low_name, high_name = _RANGED[op]
        low = arguments.get(low_name, 0) if low_name else 0
        high = arguments.get(high_name)
        if dtype not in _RANDOM_DTYPES or not isinstance(low, int) or not isinstance(high, int) or high <= low:
            return None  # random_(from, None) ranges up to the dtype's limit: not modelled
        return Kernel("grid_stride", 2 if high - low >= _WIDE_RANGE else 4)
    if op == _aten.native_dropout.default:
        return Kernel("fused_dropout") if dtype in _FLOATS else None
    if op in _BERNOULLI_TENSOR:
        return Kernel("fixed")
    return None


def launch_increment(numel: int, unroll: int, device: DeviceProperties) -> int:
    """`calc_execution_policy`'s offset increment for one launch over `numel` elements."""
    if numel == 0:
        return 0
    grid = min(device.max_grid, (numel + BLOCK - 1) // BLOCK)
    return ((numel - 1) // (BLOCK * grid * unroll) + 1) * 4


def offset_increment(
    op: OpOverload,
    dtype: torch.dtype,
    shape: Sequence[int],
    device: DeviceProperties | None,
    *,
    stride: Sequence[int] | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> int | None:
    """How far `op` writing a tensor of `dtype`, `shape` and `stride` (None: contiguous) moves the
    Philox offset of `device`'s generator; `arguments` by schema name where the rule reads them
    (random_'s range, dropout's p and train). None when not known in advance: an op, dtype or
    layout the model does not cover, or no device properties."""
    arguments = arguments or {}
    kernel = kernel_of(op, dtype, arguments)
    if kernel is None or device is None:
        return None
    numel = 1
    for size in shape:
        numel *= size
    if kernel.rule == "fixed":
        return BERNOULLI_TENSOR_INCREMENT if numel else None
    if kernel.rule == "fused_dropout":
        if arguments.get("train") is False or arguments.get("p") == 1:
            return 0
        return launch_increment(numel, 4, device)
    return _grid_stride_increment(numel, dtype.itemsize, shape, stride, kernel.unroll, device)


def _grid_stride_increment(
    numel: int,
    itemsize: int,
    shape: Sequence[int],
    stride: Sequence[int] | None,
    unroll: int,
    device: DeviceProperties,
) -> int | None:
    """The whole tensor's increment, plus each 32-bit piece's where it is split (note [Philox
    offset increments]); None for a non-dense layout that needs splitting."""
    stride = stride if stride is not None else _contiguous_stride(shape)
    if any(size > 1 and step == 0 for size, step in zip(shape, stride)):
        return None  # overlapping: the kernel refuses to write it
    last_byte = 1 + sum((size - 1) * step * itemsize for size, step in zip(shape, stride))
    whole = launch_increment(numel, unroll, device)
    if numel <= INT32_MAX and last_byte <= INT32_MAX:
        return whole
    if not _is_dense(shape, stride):
        return None
    return whole + sum(launch_increment(piece, unroll, device) for piece in pieces_32bit(numel, itemsize))


def pieces_32bit(numel: int, itemsize: int, limit: int = INT32_MAX) -> list[int]:
    """Element counts of the pieces `with_32bit_indexing` cuts a dense tensor into, in the order it
    runs them: its one coalesced dimension halved (first half size // 2) until each piece fits.
    `limit` is TensorIterator's 32-bit limit (a parameter for tests)."""
    if numel <= limit and 1 + (numel - 1) * itemsize <= limit:
        return [numel]
    half = numel // 2
    return pieces_32bit(half, itemsize, limit) + pieces_32bit(numel - half, itemsize, limit)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether the layout is a permutation of a contiguous one (TensorIterator coalesces it to 1-D)."""
    expected = 1
    for size, step in sorted((pair for pair in zip(shape, stride) if pair[0] != 1), key=lambda pair: pair[1]):
        if step != expected:
            return False
        expected *= size
    return True


# The arguments any rule reads (`kernel_of`, `offset_increment`), and the ops whose rule reads them.
_READ_ARGUMENTS = ("from", "to", "low", "high", "p", "train")
_READS_ARGUMENTS = frozenset({*_RANGED, _aten.native_dropout.default})


def recorded_increment(graph: InitGraph, op: OpNode, device: DeviceProperties | None) -> int | None:
    """How far recorded random `op` moves its CUDA generator's offset, or None when not known in
    advance (the CUDA counterpart of `draws.draw_count`)."""
    if not op.output_ids or writes_out_argument(op.func):
        return None
    written = written_tensor(graph, op)
    if written.device.type != "cuda":
        return None
    arguments = {name: argument_value(op, name) for name in _READ_ARGUMENTS} if op.func in _READS_ARGUMENTS else {}
    return offset_increment(op.func, written.dtype, written.shape, device, stride=written.stride, arguments=arguments)


class StreamIncrements:
    """`recorded_increment` for the ops of one CUDA stream, memoised by layout.

    A late layer's state sums the increments of every random op before it (1,115 for Llama-3-70B's
    last layer), and a model repeats a handful of (op, dtype, shape, stride) layouts, so each layout
    is worked out once. Keys use the op's identity (OpOverloads are interned, and their `__hash__`
    is Python code); ops whose rule reads their arguments are not memoised."""

    def __init__(self, graph: InitGraph, device: DeviceProperties | None) -> None:
        self.graph = graph
        self.device = device
        self._memo: dict[tuple, int | None] = {}

    def __call__(self, op: OpNode) -> int | None:
        outputs = op.output_ids
        if not outputs or self.device is None:
            return None
        func_id = id(op.func)
        if func_id in _READS_ARGUMENTS_IDS:
            return recorded_increment(self.graph, op, self.device)
        written = self.graph.tensors[outputs[0]]
        key = (func_id, written.dtype, written.shape, written.stride, written.device)
        try:
            return self._memo[key]
        except KeyError:
            found = self._memo[key] = recorded_increment(self.graph, op, self.device)
            return found


_READS_ARGUMENTS_IDS = frozenset(id(func) for func in _READS_ARGUMENTS)


def advanced_state(state: torch.Tensor, increment: int) -> torch.Tensor:
    """A CUDA generator state with the same seed and its offset moved by `increment`."""
    seed, offset = cuda_state_fields(state)
    return cuda_state(seed, offset + increment)
