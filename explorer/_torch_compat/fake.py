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
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
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
    "set_in_kernel_invocation",
    "in_kernel_invocation",
    "unset_fake_temporarily",
]

_META = torch.device("meta")
_CPU = torch.device("cpu")


def _sample_fake(fake_mode: FakeTensorMode, device: torch.device) -> FakeTensor:
    """A fake of no elements on `device`, made by FakeTensor.__new__ itself."""
    with torch._C._DisableTorchDispatch():
        return FakeTensor(fake_mode, torch.empty(0, device=_META), device)


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


class KeyedFakeTensorMode(FakeTensorMode):
    """FakeTensorMode that reads a dense fake's part of its op cache keys directly (note [A dense
    fake's cache key, read directly])."""

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
