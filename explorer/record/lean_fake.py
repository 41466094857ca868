"""A short path through fake mode for the few ops that dominate module construction.

Building a 7B-parameter model issues about a thousand ops, nearly all of them `empty`, `detach`,
`ones` and in-place fills. FakeTensorMode handles each through a general machine (cache keys,
constant propagation, device unification) that costs several times the meta kernel itself. For
these ops the answer is simple: run the meta kernel on the fake tensors (which are meta tensors
underneath) and wrap the result with the device that the op would have produced — the recorded
device for factories, the input's device for views. Every other op goes through FakeTensorMode.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from .fake import DeferredTensor

_aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")

FACTORIES = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.zeros.default,
        _aten.ones.default,
        _aten.full.default,
        _aten.arange.default,
        _aten.arange.start,
        _aten.arange.start_step,
        _aten.linspace.default,
    }
)
VIEWS = frozenset(
    {
        _aten.detach.default,
        _aten.alias.default,
        _aten.view.default,
        _aten.t.default,
        _aten.transpose.int,
        _aten.permute.default,
        _aten.unsqueeze.default,
        _aten.expand.default,
        _aten.as_strided.default,
        _aten.select.int,
        _aten.slice.Tensor,
    }
)
FILLS = frozenset({_aten.fill_.Scalar, _aten.zero_.default, _aten.copy_.default})
_LIFT_FRESH = _aten.lift_fresh.default
_DETACH = _aten.detach.default


@functools.cache
def _is_plain_compute(func: Any) -> bool:
    """Pointwise ops (and clone) that write nothing, draw no random numbers and return one tensor:
    their fake result is the meta kernel's result on the inputs' device."""
    schema = func._schema
    if func is _aten.clone.default:
        return True
    return (
        torch.Tag.pointwise in func.tags
        and torch.Tag.nondeterministic_seeded not in func.tags
        and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        and len(schema.returns) == 1
        and str(schema.returns[0].type) == "Tensor"
    )


def _common_device(fake_mode: FakeTensorMode, values: Any) -> torch.device | None:
    """The one device of the tensors among `values` when all are ours (None otherwise or if none)."""
    device = None
    for value in values:
        if isinstance(value, torch.Tensor):
            if type(value) is not DeferredTensor or value.fake_mode is not fake_mode:
                return None
            if device is None:
                device = value.fake_device
            elif value.fake_device != device:
                return None
    return device


def _lift_fresh(make: FakeFactory, constant: Any) -> Any:
    """`torch.tensor([...])` hands its new CPU constant to `lift_fresh`: a fake of the same layout."""
    if (
        type(constant) is not torch.Tensor
        or constant.requires_grad
        or constant.storage_offset() != 0
        or not constant.is_contiguous()
        or constant.untyped_storage().nbytes() != constant.numel() * constant.element_size()
    ):
        return NotImplemented
    with torch._C._DisableTorchDispatch():
        out = torch.empty_strided(constant.shape, constant.stride(), dtype=constant.dtype, device=_META)
    return make(out, constant.device)


class FakeFactory:
    """Makes DeferredTensors around meta tensors without FakeTensor.__new__'s general checks.

    The attribute set comes from one FakeTensor built the normal way, so it follows whatever this
    torch version's FakeTensor keeps.
    """

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        with torch._C._DisableTorchDispatch():
            sample = FakeTensor(fake_mode, torch.empty(0, device=_META), _CPU)
        self.template = dict(sample.__dict__)
        self.devices: dict[torch.device, torch.device] = {}
        self.throw_on_data_ptr = not fake_mode._allow_unsafe_data_ptr_access

    def __call__(self, elem: torch.Tensor, device: torch.device, requires_grad: bool | None = None) -> DeferredTensor:
        """A fake on `device` over a detached alias of `elem` (`_make_subclass` detaches it), with
        `elem`'s requires_grad unless `requires_grad` is given."""
        normalized = self.devices.get(device)
        if normalized is None:
            normalized = self.devices[device] = FakeTensor._normalize_fake_device(device)
        tensor = torch.Tensor._make_subclass(
            DeferredTensor,
            elem,
            elem.requires_grad if requires_grad is None else requires_grad,
            dispatch_device=True,
            device_for_backend_keys=normalized,
        )
        if self.throw_on_data_ptr:
            torch._C._set_throw_on_mutable_data_ptr(tensor)
        attributes = tensor.__dict__
        attributes.update(self.template)
        attributes["_fake_device"] = normalized
        return tensor


def _run_meta(fake_mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` with fake tensors acting as the meta tensors they are underneath."""
    previous = fake_mode.in_kernel_invocation
    with torch._C._DisableTorchDispatch(), torch._C._PreserveDispatchKeyGuard():
        fake_mode.in_kernel_invocation = True
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            return func(*args, **kwargs)
        finally:
            fake_mode.in_kernel_invocation = previous


# Ops whose meta kernels are Python references (arange, pow, reciprocal...) cost far more than the
# CPU kernels themselves; for small CPU tensors the layout is taken from the CPU kernel run on
# uninitialized stand-ins of the inputs (pointwise ops cannot fail or branch on float values). For a
# tensor recorded on the CPU that is also the layout eager construction gets.
_SMALL = 1 << 16
_ARANGES = frozenset({_aten.arange.default, _aten.arange.start, _aten.arange.start_step})


def _small_arange(args: tuple) -> bool:
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    try:
        return step != 0 and 0 <= (end - start) / step <= _SMALL
    except TypeError:
        return False


def _layout_from_cpu(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A meta tensor with the layout `func` gives on the CPU, or None when that is not cheap."""
    total = 0
    stand_ins = []
    for value in args:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                return None
            total += value.numel()
            value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
        stand_ins.append(value)
    if total > _SMALL or any(isinstance(value, torch.Tensor) for value in kwargs.values()):
        return None
    out = func(*stand_ins, **kwargs)
    return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=_META)


# The Python bindings of the hot factories: the same kernels, called through the argument parser
# instead of `OpOverload.__call__`'s boxed schema path (about half the cost). Their positional
# arguments are the schema's, and they take the schema's keyword arguments (dtype, layout, device,
# pin_memory, memory_format).
_BINDINGS = {
    _aten.empty.memory_format: torch.empty,
    _aten.empty_strided.default: torch.empty_strided,
    _aten.zeros.default: torch.zeros,
    _aten.ones.default: torch.ones,
    _aten.full.default: torch.full,
}

_FACTORY, _VIEW, _FILL, _LIFT, _PLAIN = "factory", "view", "fill", "lift", "plain"
# The short path each op takes (None: FakeTensorMode), by id(): OpOverload hashes in Python.
_PATHS: dict[int, tuple[Any, str | None]] = {}


def _path(func: Any) -> str | None:
    entry = _PATHS.get(id(func))
    if entry is None:
        path: str | None
        if func in FACTORIES:
            path = _FACTORY
        elif func in VIEWS:
            path = _VIEW
        elif func in FILLS:
            path = _FILL
        elif func is _LIFT_FRESH:
            path = _LIFT
        else:
            path = _PLAIN if _is_plain_compute(func) else None
        entry = _PATHS[id(func)] = (func, path)
    return entry[1]


def lean_dispatch(fake_mode: FakeTensorMode, make: FakeFactory, func: Any, args: tuple, kwargs: dict) -> Any:
    """The op's fake result by the short path, or NotImplemented when the op is not one of ours."""
    path = _path(func)
    if path is None:
        return NotImplemented
    if path is _FACTORY:
        device = kwargs.get("device") or _CPU
        if device.type == "meta":
            return NotImplemented
        for a in args:
            if isinstance(a, torch.Tensor):
                return NotImplemented
        with torch._C._DisableTorchDispatch():
            if device.type == "cpu" and func in _ARANGES and _small_arange(args):
                out = func(*args, **kwargs)
                out = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=_META)
            else:
                out = _BINDINGS.get(func, func)(*args, **{**kwargs, "device": _META})
        return make(out, device)
    if path is _VIEW or path is _FILL:
        if not args or type(args[0]) is not DeferredTensor or args[0].fake_mode is not fake_mode:
            return NotImplemented
        if (
            func is _DETACH
            and len(args) == 1
            and not kwargs
            and not args[0].is_inference()
            and not torch.is_inference_mode_enabled()
        ):
            # `_make_subclass` detaches its argument itself: the same fake as running `detach`'s meta
            # kernel first, without that call (`Parameter(t)` issues one per parameter).
            with torch._C._DisableTorchDispatch():
                return make(args[0], args[0].fake_device, False)
        if func is _aten.copy_.default:
            if _common_device(fake_mode, args) is None:
                return NotImplemented
        elif any(isinstance(a, torch.Tensor) for a in args[1:]):
            return NotImplemented
        out = _run_meta(fake_mode, func, args, kwargs)
        if path is _FILL:
            return args[0]
        return make(out, args[0].fake_device)
    if path is _LIFT:
        return _lift_fresh(make, args[0])
    device = _common_device(fake_mode, (*args, *kwargs.values()))
    if device is None:
        return NotImplemented
    if device.type == "cpu":
        with torch._C._DisableTorchDispatch():
            out = _layout_from_cpu(func, args, kwargs)
        if out is not None:
            return make(out, device)
    return make(_run_meta(fake_mode, func, args, kwargs), device)
