"""A short path through fake mode for the few ops that dominate module construction.

Building a 7B-parameter model issues about a thousand ops, nearly all of them `empty`, `detach`,
`ones` and in-place fills. FakeTensorMode handles each through a general machine (cache keys,
constant propagation, device unification) that costs several times the meta kernel itself. For
these ops the answer is simple: run the meta kernel on the fake tensors (which are meta tensors
underneath) and wrap the result with the device that the op would have produced — the recorded
device for factories, the input's device for views. `cat` and `stack`, which loaders call on hundreds
of expert tensors at once, compute a plain contiguous answer directly. Every other op goes through
FakeTensorMode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .._torch_compat.dispatch import disable_torch_dispatch, meta_in_tls_dispatch_include, preserve_dispatch_key_guard
from .._torch_compat.fake import FakeTemplate, FakeTensorMode, fake_device_of, set_in_kernel_invocation
from .fake import DeferredTensor

_aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")

FACTORIES = set(  # grows by `register_factory`
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
# Ops joining a list of tensors. Loaders stack a checkpoint's per-expert tensors into one parameter
# (transformers' MergeModulelist: 256 tensors per call for DeepSeek-V3), where FakeTensorMode's cache
# key alone hashes every input's metadata (milliseconds per call) and its meta path runs per input;
# the C++ meta kernel (eager's own shape, stride and promotion rules) takes microseconds.
JOINS = frozenset({_aten.cat.default, _aten.stack.default})
_LIFT_FRESH = _aten.lift_fresh.default
_DETACH = _aten.detach.default
_COPY = _aten.copy_.default


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
    with disable_torch_dispatch():
        out = torch.empty_strided(constant.shape, constant.stride(), dtype=constant.dtype, device=_META)
    return make(out, constant.device)


class FakeFactory(FakeTemplate):
    """Makes DeferredTensors around meta tensors without FakeTensor.__new__'s general checks
    (note [Fakes from a template] in explorer/_torch_compat/fake.py).

    Instance attributes that DeferredTensor's class already says (None memos) are left out, so
    the fakes recording makes by the thousand carry a small dict.
    """

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        super().__init__(fake_mode, DeferredTensor, _said_by_class)


def _said_by_class(name: str, value: Any) -> bool:
    return value is None and getattr(DeferredTensor, name, _ABSENT) is None


_ABSENT = object()


def _run_meta(fake_mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` with fake tensors acting as the meta tensors they are underneath."""
    previous = fake_mode.in_kernel_invocation
    with disable_torch_dispatch(), preserve_dispatch_key_guard():
        set_in_kernel_invocation(fake_mode, True)
        meta_in_tls_dispatch_include(True)
        try:
            return func(*args, **kwargs)
        finally:
            set_in_kernel_invocation(fake_mode, previous)


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
# `zeros` and `ones` take `empty`'s: on the meta device values do not exist, the layout and dtype
# rules are `empty`'s, and their own meta kernels run a fill (a Python reference) after it.
_BINDINGS = {
    _aten.empty.memory_format: torch.empty,
    _aten.empty_strided.default: torch.empty_strided,
    _aten.zeros.default: torch.empty,
    _aten.ones.default: torch.empty,
    _aten.full.default: torch.full,
}

_FACTORY, _VIEW, _FILL, _LIFT, _PLAIN, _JOIN = "factory", "view", "fill", "lift", "plain", "join"


class _Route(NamedTuple):
    """How the short path treats one op overload, decided once per overload."""

    func: Any  # kept alive: routes are found by id(func)
    path: str | None  # None: FakeTensorMode
    call: Any  # what a factory calls on the meta device (its Python binding, or the overload)
    small_arange: bool  # an arange: small CPU ones take their layout from the CPU kernel


# By id(): OpOverload hashes in Python (torch/_ops.py), and these are looked up for every op.
_ROUTES: dict[int, _Route] = {}


def register_factory(func: Any, binding: Callable[..., torch.Tensor]) -> None:
    """Record custom op `func` as the factories are (note [Direct records]): it takes plain
    arguments only, writes nothing, and returns a new tensor, whose fake is `binding(*args,
    **kwargs)` with `device` the meta device. For ops whose fake costs a FakeTensorMode dispatch
    (about 2 ms) and that a loader calls per tensor: `explorer::read_safetensors`."""
    FACTORIES.add(func)
    _BINDINGS[func] = binding
    _ROUTES.pop(id(func), None)


def _route(func: Any) -> _Route:
    route = _ROUTES.get(id(func))
    if route is None:
        path: str | None
        if func in FACTORIES:
            path = _FACTORY
        elif func in VIEWS:
            path = _VIEW
        elif func in FILLS:
            path = _FILL
        elif func is _LIFT_FRESH:
            path = _LIFT
        elif func in JOINS:
            path = _JOIN
        else:
            path = _PLAIN if _is_plain_compute(func) else None
        route = _ROUTES[id(func)] = _Route(func, path, _BINDINGS.get(func, func), func in _ARANGES)
    return route


# Note: [Fills checked once per layout]
# A fill (`fill_`, `zero_`) leaves its target's metadata as it was: the meta kernel is run only to
# raise what it raises, and its outcome depends on nothing but the op, the target's dtype, shape and
# stride, the scalar, and inference state. Its Python reference implementation costs more than the
# rest of recording the op, and constructors fill tensors of a few layouts hundreds of times, so a
# call that succeeded once is not run again for the same key (one that raised is never remembered).
_SCALARS = (float, int, bool)
_FILLS_PASSED: set[tuple] = set()
_FILLS_REMEMBERED = 4096  # a bound, for programs that fill tensors of endless layouts


def _fill_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The memo key of a scalar fill (see note [Fills checked once per layout]), or None."""
    if kwargs or func is _COPY:
        return None
    if len(args) == 2:
        value = args[1]
        if type(value) not in _SCALARS:
            return None
    elif len(args) == 1:
        value = None
    else:
        return None
    target = args[0]
    return (
        id(func),
        target.dtype,
        target.shape,
        target.stride(),
        type(value),
        value,
        target.is_inference(),
        torch.is_inference_mode_enabled(),
    )


def lean_dispatch(fake_mode: FakeTensorMode, make: FakeFactory, func: Any, args: tuple, kwargs: dict) -> Any:
    """The op's fake result by the short path, or NotImplemented when the op is not one of ours."""
    route = _ROUTES.get(id(func)) or _route(func)
    path = route.path
    if path is None:
        return NotImplemented
    if path is _FACTORY:
        return _factory(make, route, args, kwargs)
    if path is _VIEW or path is _FILL:
        if not args or type(args[0]) is not DeferredTensor or args[0].fake_mode is not fake_mode:
            return NotImplemented
        if path is _FILL:
            return _fill(fake_mode, func, args, kwargs)
        if func is _DETACH and len(args) == 1 and not kwargs:
            out = detached_fake(make, args[0])
            if out is not NotImplemented:
                return out
        if any(isinstance(a, torch.Tensor) for a in args[1:]):
            return NotImplemented
        return make(_run_meta(fake_mode, func, args, kwargs), args[0].fake_device)
    if path is _LIFT:
        return _lift_fresh(make, args[0])
    if path is _JOIN:
        return _join(fake_mode, make, func, args, kwargs)
    device = _common_device(fake_mode, (*args, *kwargs.values()))
    if device is None:
        return NotImplemented
    if device.type == "cpu":
        with disable_torch_dispatch():
            out = _layout_from_cpu(func, args, kwargs)
        if out is not None:
            return make(out, device)
    return make(_run_meta(fake_mode, func, args, kwargs), device)


def _join(fake_mode: FakeTensorMode, make: FakeFactory, func: Any, args: tuple, kwargs: dict) -> Any:
    """`cat` / `stack` of a non-empty list of this recording's fakes on one device (and a plain
    dimension); NotImplemented otherwise (mixed devices, real tensors: FakeTensorMode decides)."""
    if not args or type(args[0]) not in (list, tuple) or not args[0]:
        return NotImplemented
    if any(isinstance(value, torch.Tensor) for value in (*args[1:], *kwargs.values())):
        return NotImplemented
    device = _common_device(fake_mode, args[0])
    if device is None:
        return NotImplemented
    if func is _STACK:
        return _stack(fake_mode, make, device, *args, **kwargs)
    joined = _contiguous_cat(args[0], *args[1:], **kwargs)
    return make(joined if joined is not None else _run_meta(fake_mode, func, args, kwargs), device)


def _contiguous_cat(tensors: Any, dim: int = 0) -> torch.Tensor | None:
    """`cat`'s meta result when its answer is plain: contiguous inputs of one dtype and rank at most
    3 (no memory format to choose), equal but in `dim`. Eager then returns a new contiguous tensor;
    the meta kernel (a Python function looping over the inputs) is skipped. None otherwise."""
    first = tensors[0]
    shape = first.shape
    rank = len(shape)
    wrapped = dim + rank if dim < 0 else dim
    if not 0 < rank <= 3 or not 0 <= wrapped < rank:
        return None
    dtype = first.dtype
    total = 0
    for tensor in tensors:
        other = tensor.shape
        if tensor.dtype != dtype or len(other) != rank or not tensor.is_contiguous():
            return None
        if other[:wrapped] != shape[:wrapped] or other[wrapped + 1 :] != shape[wrapped + 1 :]:
            return None
        total += other[wrapped]
    with disable_torch_dispatch():
        return torch.empty((*shape[:wrapped], total, *shape[wrapped + 1 :]), dtype=dtype, device=_META)


def _stack(fake_mode: FakeTensorMode, make: FakeFactory, device: torch.device, tensors: Any, dim: int = 0) -> Any:
    """`stack` as its meta path computes it (torch._refs.stack: one `cat`, then a view), without
    that reference's per-input Python checks (milliseconds for 256 inputs). Inputs of unequal
    shapes or a dimension out of range are handed back, for FakeTensorMode to raise eager's error."""
    shape = tensors[0].shape
    rank = len(shape)
    wrapped = dim + rank + 1 if dim < 0 else dim
    if not 0 <= wrapped <= rank or any(tensor.shape != shape for tensor in tensors):
        return NotImplemented
    if rank <= 2 and all(tensor.dtype == tensors[0].dtype and tensor.is_contiguous() for tensor in tensors):
        with disable_torch_dispatch():  # what `cat` gives contiguous inputs (`_contiguous_cat`)
            joined = torch.empty(
                (*shape[:wrapped], len(tensors), *shape[wrapped:]), dtype=tensors[0].dtype, device=_META
            )
    elif wrapped < rank:
        sizes = [*shape[:wrapped], len(tensors), *shape[wrapped:]]
        joined = _run_meta(fake_mode, _cat_view, (tensors, wrapped, sizes), {})
    else:
        joined = _run_meta(fake_mode, _cat_unsqueezed, (tensors, wrapped), {})
    return make(joined, device)


def _cat_view(tensors: Any, dim: int, sizes: list[int]) -> torch.Tensor:
    return _aten.view.default(_aten.cat.default(tensors, dim), sizes)


def _cat_unsqueezed(tensors: Any, dim: int) -> torch.Tensor:
    return _aten.cat.default([_aten.unsqueeze.default(tensor, dim) for tensor in tensors], dim)


_STACK = _aten.stack.default


def detached_fake(make: FakeFactory, tensor: DeferredTensor) -> Any:
    """`tensor.detach()`'s fake (`Parameter(t)` issues one per parameter), or NotImplemented for an
    inference tensor or under inference mode. `_make_subclass` detaches its argument itself: the
    same fake as running `detach`'s meta kernel first, without that call."""
    if tensor.is_inference() or torch.is_inference_mode_enabled():
        return NotImplemented
    with disable_torch_dispatch():
        return make(tensor, fake_device_of(tensor), False)


def factory_fake(make: FakeFactory, func: Any, args: tuple, kwargs: dict) -> Any:
    """A factory op's fake (`func` one of FACTORIES), or NotImplemented (meta device, tensor args)."""
    return _factory(make, _ROUTES.get(id(func)) or _route(func), args, kwargs)


def factory_meta_call(func: Any) -> Any:
    """What `factory_fake` calls on the meta device for factory `func` (its Python binding or the
    overload, given the op's arguments and its keyword arguments with `device=meta`), or None for an
    arange (a small one on the CPU takes its layout from the CPU kernel instead)."""
    route = _ROUTES.get(id(func)) or _route(func)
    return None if route.small_arange else route.call


def meta_kwargs(kwargs: dict) -> dict:
    """A factory's keyword arguments as `factory_fake` passes them to its meta call."""
    return {**kwargs, "device": _META}


def planned_fake(make: FakeFactory, call: Any, args: tuple, kwargs: dict, kwargs_on_meta: dict) -> Any:
    """A factory's fake made as `factory_fake` makes it, from what a plan remembers of the first call
    of its signature (note [Op plans] in record/plans.py): `call` from `factory_meta_call`,
    `kwargs_on_meta` from `meta_kwargs`."""
    with disable_torch_dispatch():
        out = call(*args, **kwargs_on_meta)
    return make(out, kwargs.get("device") or _CPU)


# Whether a device is the meta device, by the device: `device.type` makes a new string per call.
_IS_META: dict[torch.device, bool] = {}


def _factory(make: FakeFactory, route: _Route, args: tuple, kwargs: dict) -> Any:
    """A factory's fake: its meta kernel's result on the device the op names."""
    device = kwargs.get("device") or _CPU
    is_meta = _IS_META.get(device)
    if is_meta is None:
        is_meta = _IS_META[device] = device.type == "meta"
    if is_meta:
        return NotImplemented
    for a in args:
        if isinstance(a, torch.Tensor):
            return NotImplemented
    with disable_torch_dispatch():
        if route.small_arange and device.type == "cpu" and _small_arange(args):
            out = route.func(*args, **kwargs)
            out = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=_META)
        else:
            out = route.call(*args, **meta_kwargs(kwargs))
    return make(out, device)


def _fill(fake_mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Any:
    """A fill (or `copy_`) returns its target; the meta kernel runs to raise what eager's would."""
    if func is _COPY:
        if _common_device(fake_mode, args) is None:
            return NotImplemented
    elif any(isinstance(a, torch.Tensor) for a in args[1:]):
        return NotImplemented
    key = _fill_key(func, args, kwargs)
    if key is None or key not in _FILLS_PASSED:
        _run_meta(fake_mode, func, args, kwargs)
        if key is not None:
            if len(_FILLS_PASSED) >= _FILLS_REMEMBERED:
                _FILLS_PASSED.clear()
            _FILLS_PASSED.add(key)
    return args[0]
