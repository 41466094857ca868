"""FakeTensor as this torch release lays it out: its classes, where a fake keeps its device, and
fakes made from a template instead of FakeTensor.__new__'s general checks.

Note: [Where a fake keeps its device]
torch 2.11 and 2.12 set the instance attribute `fake_device` in FakeTensor.__new__; 2.13 to 2.15
keep `_fake_device` behind a `fake_device` property (pytorch#181387); FakeTensor is moving into C++
(pytorch#194780, #197254), where neither may be an instance attribute. The key is read off a fake
made the normal way, not from the version: where no instance attribute holds the device, the
public `fake_device` attribute is read instead (slower, still right).

Note: [Fakes from a template]
Recording makes about a thousand fakes per 7B model. FakeTensor.__new__ checks and normalizes each
one; `FakeTemplate` makes one fake per device the normal way and copies its instance attributes
onto the next fakes of that device (made with `_make_subclass`, as __new__ does). Whether that
gives the same fake is checked once per device against the normally made one; where it does not
(a release that keeps fake state outside `__dict__`), fakes are made with __new__ itself.

Note: [A dense fake's cache key, read directly]
FakeTensorMode caches each op's output by a key made of every argument's metadata. For each fake
argument it builds `TensorMetadata` (seventeen fields, sparse and quantized ones included) and walks
it: about a sixth of a planner's fake step went there. `KeyedFakeTensorMode` puts in its place, for
a dense fake (strided, unquantized, static shapes, of this mode, not a constant), the metadata an
output can depend on, read directly: dtype, device, shape, stride, storage offset and size,
requires_grad, the conjugate, negative and inference bits (the memory format FakeTensorMode also
keys on follows from shape and stride; the rest are fixed for a dense fake). A marker opens that
part, so no key of FakeTensorMode's own (the other fakes', other modes') can equal one of these.
Keys stay equal exactly when FakeTensorMode's are: `tests/explorer/test_torch_compat.py` checks it,
pair by pair, over fakes differing in each of those, on every tested release. Re-check
`_prep_args_for_hash` (its container and argument walk) and `TensorMetadata`'s fields on upgrades.

Note: [A cache hit, taken directly]
Even with the key read directly, a cached op cost about 48 µs on a fake: FakeTensorMode's
`dispatch`, `_cached_dispatch_impl` and `_cache_key` layers, then `FakeTensor.__new__`'s checks for
the output. A planner's fake step is almost all cache hits (39,000 hits to 800 misses on a
four-stage Llama layout). `KeyedFakeTensorMode.dispatch` takes a hit in one step when every argument
is a dense fake of this mode (note above), a plain scalar, or a list or tuple of those:
- its own key for the call (the op, default dtype and device, inference mode, then each argument's
  type and value, a dense fake's key part in a fake's place) names FakeTensorMode's key for the same
  call. The first call with a key computes FakeTensorMode's key and runs FakeTensorMode's dispatch;
  the entry FakeTensorMode cached is then looked up by that key on every later call, so a cleared
  cache, a bypass, or an op FakeTensorMode answers before its cache (device queries) goes back to
  FakeTensorMode. Nothing is answered that FakeTensorMode's own cache does not hold.
- the output is made from the entry as `_get_output_tensor_from_cache_entry` makes it (the argument
  itself for an in-place op, a meta tensor of the cached metadata, sharing the argument's storage
  for a view), wrapped by `FakeTemplate` instead of `FakeTensor.__new__`.
`aten._unsafe_view` (every `Linear` on a 3-D input calls it), which torch 2.11 to 2.14 never cache,
is answered as `aten.view`: ATen runs one kernel (`view_impl`) for both, FakeTensorMode gives both the
same outputs and errors, and torch 2.15 caches `_unsafe_view` as a view. Anything else (symbols, a
shape environment, a tracer, other fakes or tensors, dicts, callables, cross-checking) goes through
FakeTensorMode unchanged. A cached `add` of two fakes: 48 → 18 µs.
`tests/explorer/test_torch_compat.py` compares each output (metadata, storage sharing, identity of
in-place results, tuples, constants) with FakeTensorMode's own on the same calls. Re-check
`_cached_dispatch_impl`, `_get_output_tensor_from_cache_entry` and the entry classes on upgrades.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._prims_common import suggest_memory_format as _suggest_memory_format
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    _BypassDispatchCache,
    _CacheKeyState,
    _DispatchCacheValidEntry,
    unset_fake_temporarily,
)

__all__ = [
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "FakeTemplate",
    "FakeTensor",
    "FakeTensorMode",
    "KeyedFakeTensorMode",
    "dense_key_part",
    "UnsupportedFakeTensorException",
    "allows_unsafe_data_ptr",
    "fake_device_of",
    "fake_device_key",
    "fake_instance_attributes",
    "set_in_kernel_invocation",
    "in_kernel_invocation",
    "kernel_memory_format",
    "meta_failures_unlogged",
    "unset_fake_temporarily",
]

_META = torch.device("meta")


def kernel_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """The layout ATen's `Tensor::suggest_memory_format()` gives `tensor` (what kernels that
    allocate `empty_like(x, x.suggest_memory_format())` lay their output out as): channels_last for
    4-d and channels_last_3d for 5-d tensors with channels-last strides, else contiguous."""
    return _suggest_memory_format(tensor)


_CPU = torch.device("cpu")


def _sample_fake(fake_mode: FakeTensorMode, device: torch.device) -> FakeTensor:
    """A fake of no elements on `device`, made by FakeTensor.__new__ itself."""
    with torch._C._DisableTorchDispatch():
        return FakeTensor(fake_mode, torch.empty(0, device=_META), device)


@functools.cache
def fake_instance_attributes() -> frozenset[str]:
    """The attributes FakeTensor.__new__ gives each fake on this release (`fake_mode`, where it keeps
    the device, memos on some releases): a fake's own state, which `type(p)(data, **p.__dict__)`
    passes along with whatever a user or library set on `p`."""
    return frozenset(vars(_sample_fake(FakeTensorMode(), _CPU)))


@functools.cache
def fake_device_key() -> str | None:
    """Which instance attribute holds a fake's device here (note [Where a fake keeps its device]);
    None: no such attribute. Found on first use, since the sample fake's FakeTensorMode imports
    torch._dynamo (over a second), which `import explorer` must not pay for."""
    sample = _sample_fake(FakeTensorMode(), _CPU)
    for key in ("_fake_device", "fake_device"):
        if sample.__dict__.get(key) == _CPU:
            return key
    return None


def _device_reader() -> Callable[[FakeTensor], torch.device]:
    key = fake_device_key()
    if key is None:
        return operator.attrgetter("fake_device")

    def read(tensor: FakeTensor) -> torch.device:
        return tensor.__dict__[key]

    return read


def _first_read(tensor: FakeTensor) -> torch.device:
    global _read_device
    _read_device = _device_reader()
    return _read_device(tensor)


_read_device: Callable[[FakeTensor], torch.device] = _first_read


def fake_device_of(tensor: FakeTensor) -> torch.device:
    """The device a fake tensor stands for (its `fake_device`), read the fastest way here."""
    return _read_device(tensor)


def in_kernel_invocation(fake_mode: FakeTensorMode) -> bool:
    """Whether `fake_mode` is running a meta kernel (fakes then report the meta device)."""
    return bool(fake_mode.in_kernel_invocation)


def set_in_kernel_invocation(fake_mode: FakeTensorMode, value: bool) -> None:
    """Set the flag FakeTensor.device reads to answer `meta` while a meta kernel runs on fakes."""
    fake_mode.in_kernel_invocation = value


def allows_unsafe_data_ptr(fake_mode: FakeTensorMode) -> bool:
    """Whether `fake_mode`'s fakes let `data_ptr()` through (default: they raise)."""
    return bool(getattr(fake_mode, "_allow_unsafe_data_ptr_access", False))


_make_subclass = torch.Tensor._make_subclass
_set_throw_on_mutable_data_ptr = torch._C._set_throw_on_mutable_data_ptr


class FakeTemplate:
    """Makes fakes of class `cls` (a FakeTensor subclass) around meta tensors, as FakeTensor.__new__
    would, at the cost of `_make_subclass` and a dict update (note [Fakes from a template]).

    `skip(name, value)` leaves out instance attributes that `cls` already says on the class.
    """

    def __init__(
        self, fake_mode: FakeTensorMode, cls: type[FakeTensor], skip: Callable[[str, Any], bool] | None = None
    ) -> None:
        self.fake_mode = fake_mode
        self.cls = cls
        self.skip = skip or (lambda name, value: False)
        self.throw_on_data_ptr = not allows_unsafe_data_ptr(fake_mode)
        # device → (the device fakes report, attributes to copy; None: make with __new__)
        self.devices: dict[torch.device, tuple[torch.device, dict[str, Any] | None]] = {}

    def for_device(self, device: torch.device) -> tuple[torch.device, dict[str, Any] | None]:
        """The normalized device and the attribute template for `device` (memoised)."""
        entry = self.devices.get(device)
        if entry is None:
            sample = _sample_fake(self.fake_mode, device)
            normalized = sample.fake_device
            template: dict[str, Any] | None = {
                name: value for name, value in sample.__dict__.items() if not self.skip(name, value)
            }
            if not self._template_holds(template, normalized, sample):
                template = None
            entry = self.devices[device] = (normalized, template)
        return entry

    def _template_holds(self, template: dict[str, Any] | None, normalized: torch.device, sample: FakeTensor) -> bool:
        """True when a fake made from `template` reports what `sample` reports."""
        with torch._C._DisableTorchDispatch():
            made = self._from_template(torch.empty(0, device=_META), normalized, template or {}, False)
        try:
            return (
                made.fake_device == normalized
                and made.fake_mode is sample.fake_mode
                and made.device == sample.device
                and fake_device_of(made) == normalized
            )
        except (AttributeError, KeyError):
            return False

    def _from_template(
        self, elem: torch.Tensor, device: torch.device, template: dict[str, Any], requires_grad: bool
    ) -> FakeTensor:
        tensor = torch.Tensor._make_subclass(
            self.cls, elem, requires_grad, dispatch_device=True, device_for_backend_keys=device
        )
        if self.throw_on_data_ptr:
            torch._C._set_throw_on_mutable_data_ptr(tensor)
        tensor.__dict__.update(template)
        return tensor

    def __call__(self, elem: torch.Tensor, device: torch.device, requires_grad: bool | None = None) -> FakeTensor:
        """A fake on `device` over a detached alias of `elem`, with `elem`'s requires_grad unless
        `requires_grad` is given. Call with torch dispatch disabled."""
        normalized, template = self.devices.get(device) or self.for_device(device)
        grad = elem.requires_grad if requires_grad is None else requires_grad
        if template is not None:  # `_from_template`, inlined: recording makes a fake per op
            tensor = _make_subclass(self.cls, elem, grad, dispatch_device=True, device_for_backend_keys=normalized)
            if self.throw_on_data_ptr:
                _set_throw_on_mutable_data_ptr(tensor)
            tensor.__dict__.update(template)
            return tensor
        alias = elem.detach()
        alias.requires_grad_(grad)
        return self.cls(self.fake_mode, alias, normalized)


class _DenseKey(tuple):
    """A dense fake's part of a cache key, standing in for the fake in the arguments walked."""

    __slots__ = ()


class _DenseMark:
    """Opens every `_DenseKey`: no key FakeTensorMode makes holds it, so the two never collide."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<dense fake>"


_DENSE = _DenseMark()


def dense_key_part(fake: FakeTensor) -> tuple:
    """The metadata an op's cached output can depend on, for a dense (strided, unquantized) fake with
    static shapes (note [A dense fake's cache key, read directly])."""
    return (
        _DENSE,
        fake.dtype,
        fake_device_of(fake),
        fake.shape,
        fake.stride(),
        fake.storage_offset(),
        fake.untyped_storage().nbytes(),
        fake.requires_grad,
        fake.is_conj(),
        fake.is_neg(),
        fake.is_inference(),
    )


_LEAF_TYPES = frozenset(
    (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
)
_SEQUENCE_TYPES = frozenset((list, tuple, torch.Size))
_PROXY_MODE = torch._C._TorchDispatchModeKey.PROXY
_get_dispatch_mode = torch._C._get_dispatch_mode
_get_default_device = torch._C._get_default_device
_empty_strided = torch.empty_strided
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default
_VIEW = torch.ops.aten.view.default


class _StockOnly:
    """A direct key's value where FakeTensorMode must answer: it caches nothing for the call."""

    __slots__ = ()


class _KeywordsMark:
    """Separates positional from keyword arguments in a direct key."""

    __slots__ = ()


_STOCK_ONLY = _StockOnly()
_KEYWORDS = _KeywordsMark()


class _Unkeyed(Exception):
    """An argument a direct key does not cover: FakeTensorMode dispatches the call."""


class KeyedFakeTensorMode(FakeTensorMode):
    """FakeTensorMode that reads a dense fake's part of its op cache keys directly (note [A dense
    fake's cache key, read directly]) and answers its cache hits in one step (note [A cache hit,
    taken directly])."""

    # direct key → FakeTensorMode's key for the same call, or _STOCK_ONLY (shared, like its cache)
    _direct_keys: dict[tuple, Any] = {}

    def dispatch(self, func, types, args=(), kwargs=None):
        if (
            self.shape_env is not None
            or not self.cache_enabled
            or self.cache_crosscheck_enabled
            or _get_dispatch_mode(_PROXY_MODE) is not None
        ):
            return super().dispatch(func, types, args, kwargs or {})
        # `_unsafe_view` is keyed (and first run) as `view`: the same kernel (ATen's view_impl), and torch
        # 2.15 caches it as one; whatever goes back to FakeTensorMode goes as the op called
        keyed = _VIEW if func is _UNSAFE_VIEW else func
        key = self._direct_key(keyed, args, kwargs)
        if key is None:
            return super().dispatch(func, types, args, kwargs or {})
        stock_key = self._direct_keys.get(key)
        if stock_key is None:
            return self._first_call(key, keyed, types, args, kwargs or {})
        entry = None if stock_key is _STOCK_ONLY else FakeTensorMode.cache.get(stock_key)
        if type(entry) is not _DispatchCacheValidEntry:  # cleared, or never cached
            return super().dispatch(func, types, args, kwargs or {})
        FakeTensorMode.cache_hits += 1
        if entry.is_output_tuple:
            return tuple(self._cached_output(info, args) for info in entry.output_infos)
        return self._cached_output(entry.output_infos[0], args)

    def _first_call(self, key: tuple, func, types, args, kwargs) -> object:
        """Dispatch through FakeTensorMode, then remember which of its keys `key` stands for."""
        try:
            stock_key: Any = self._cache_key(_CacheKeyState(self.shape_env), func, args, kwargs)
        except _BypassDispatchCache:
            stock_key = _STOCK_ONLY
        output = super().dispatch(func, types, args, kwargs)
        if stock_key is not _STOCK_ONLY and not _plainly_cached(FakeTensorMode.cache.get(stock_key)):
            stock_key = _STOCK_ONLY
        self._direct_keys[key] = stock_key
        return output

    def _direct_key(self, func, args, kwargs) -> tuple | None:
        """The call's direct key; None where it holds an argument the key does not cover."""
        key: list[Any] = [func, torch.get_default_dtype(), _get_default_device(), torch.is_inference_mode_enabled()]
        try:
            self._add_parts(key, args)
            if kwargs:
                key.append(_KEYWORDS)
                for name, value in kwargs.items():
                    key.append(name)
                    self._add_parts(key, (value,))
        except _Unkeyed:
            return None
        return tuple(key)

    def _add_parts(self, key: list, values) -> None:
        for value in values:
            kind = type(value)
            if kind is FakeTensor:
                part = self._key_part(value)
                if part is value:
                    raise _Unkeyed
                key.append(part)
            elif kind in _LEAF_TYPES:
                key.append(kind)
                key.append(value)
            elif kind in _SEQUENCE_TYPES:
                key.append(kind)
                key.append(len(value))
                self._add_parts(key, value)
            else:
                raise _Unkeyed

    def _cached_output(self, info, args) -> object:
        """One output of a cached call, made as `_get_output_tensor_from_cache_entry` makes it."""
        if info.inplace_idx is not None:
            return args[info.inplace_idx]
        metadata = info.metadata
        if metadata is None:
            return info.constant_value if info.view_idx is None else None
        template = self.__dict__.get("_output_template")
        if template is None:
            template = self._output_template = FakeTemplate(self, FakeTensor)
        # a meta tensor of plain metadata: no fake is run on, so the meta kernels need no fake-mode state
        with torch._C._DisableTorchDispatch():
            empty = _empty_strided(
                metadata.shape,
                metadata.stride,
                dtype=metadata.dtype,
                layout=metadata.layout,
                device=_META,
                requires_grad=metadata.requires_grad,
            )
            if metadata.is_conj:
                torch._C._set_conj(empty, True)
            if metadata.is_neg:
                torch._C._set_neg(empty, True)
            if info.view_idx is not None:
                storage = args[info.view_idx].untyped_storage()
                empty.set_(storage, metadata.storage_offset, metadata.shape, metadata.stride)
            return template(empty, metadata.device)

    def _prep_args_for_hash(self, result, args, state, id_hashed_objects) -> None:
        if type(args) is _DenseKey:
            result.extend(args)
            return
        if type(args) is tuple or type(args) is list:
            if any(isinstance(arg, FakeTensor) for arg in args):
                args = type(args)(self._key_part(arg) if isinstance(arg, FakeTensor) else arg for arg in args)
        elif not isinstance(args, (dict, tuple, list)):  # a dict's keys or values: walked without a length prefix
            args = iter([self._key_part(arg) if isinstance(arg, FakeTensor) else arg for arg in args])
        super()._prep_args_for_hash(result, args, state, id_hashed_objects)

    def _key_part(self, fake: FakeTensor) -> object:
        """`fake`'s part of the key, read directly; `fake` itself where FakeTensorMode must see it
        (other modes' fakes, constants, symbolic shapes, sparse, quantized or other layouts)."""
        if (
            fake.fake_mode is not self
            or fake.constant is not None
            or fake.layout is not torch.strided
            or fake.is_quantized
            or fake._has_symbolic_sizes_strides
        ):
            return fake
        return _DenseKey(dense_key_part(fake))


def _plainly_cached(entry: object) -> bool:
    """Whether `entry` is a cached output `_cached_output` makes as FakeTensorMode would: static
    sizes, strides and offsets (symbolic ones need FakeTensorMode's shape environment)."""
    if type(entry) is not _DispatchCacheValidEntry:
        return False
    for info in entry.output_infos:
        metadata = info.metadata
        if metadata is None:
            continue
        sizes = (*metadata.shape, *metadata.stride, metadata.storage_offset)
        if any(type(size) is not int for size in sizes) or metadata.layout is not torch.strided:
            return False
    return True


# Note: [Meta failures, unlogged]
# FakeTensorMode logs the whole traceback of a meta kernel that raises, at ERROR level, before
# re-raising it ("failed while attempting to run meta for aten.div_.Tensor", `_dispatch_impl`).
# Under deferred_init the recorder re-raises such an error itself, naming the op and the user's
# line, or handles it as eager would (a constructor's own `try`): the log would print a stack
# trace eager never prints. The filter drops that one message, from that one logger, while a
# recording runs. Re-check the message and the logger's name on upgrades.
_META_FAILURE_MESSAGE = "failed while attempting to run meta for"
_FAKE_TENSOR_LOG = logging.getLogger(FakeTensor.__module__)


class _MetaFailureFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(_META_FAILURE_MESSAGE))


_META_FAILURE_FILTER = _MetaFailureFilter()
_unlogged_depth = 0


@contextlib.contextmanager
def meta_failures_unlogged() -> Iterator[None]:
    """While active, FakeTensorMode does not log a failing meta kernel's traceback (note [Meta
    failures, unlogged]); the error itself still propagates. Nestable; undone on every exit."""
    global _unlogged_depth
    if _unlogged_depth == 0:
        _FAKE_TENSOR_LOG.addFilter(_META_FAILURE_FILTER)
    _unlogged_depth += 1
    try:
        yield
    finally:
        _unlogged_depth -= 1
        if _unlogged_depth == 0:
            _FAKE_TENSOR_LOG.removeFilter(_META_FAILURE_FILTER)
