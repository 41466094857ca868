"""A short path through fake mode for the few ops that dominate module construction.

Building a 7B-parameter model issues about a thousand ops, nearly all of them `empty`, `detach`,
`ones` and in-place fills. FakeTensorMode handles each through a general machine (cache keys,
constant propagation, device unification) that costs several times the meta kernel itself. For
these ops the answer is simple: run the meta kernel on the fake tensors (which are meta tensors
underneath) and wrap the result with the device that the op would have produced — the recorded
device for factories, the input's device for views. Every other op goes through FakeTensorMode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from .fake import DeferredTensor

_aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")

FACTORIES = frozenset(
    {
        _aten.empty.memory_format, _aten.empty_strided.default, _aten.zeros.default,
        _aten.ones.default, _aten.full.default,
    }
)
VIEWS = frozenset(
    {
        _aten.detach.default, _aten.alias.default, _aten.view.default, _aten.t.default,
        _aten.transpose.int, _aten.permute.default, _aten.unsqueeze.default,
        _aten.expand.default, _aten.as_strided.default, _aten.select.int, _aten.slice.Tensor,
    }
)
FILLS = frozenset({_aten.fill_.Scalar, _aten.zero_.default})


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

    def __call__(self, elem: torch.Tensor, device: torch.device) -> DeferredTensor:
        normalized = self.devices.get(device)
        if normalized is None:
            normalized = self.devices[device] = FakeTensor._normalize_fake_device(device)
        tensor = torch.Tensor._make_subclass(
            DeferredTensor, elem, elem.requires_grad, dispatch_device=True, device_for_backend_keys=normalized
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


def lean_dispatch(fake_mode: FakeTensorMode, make: FakeFactory, func: Any, args: tuple, kwargs: dict) -> Any:
    """The op's fake result by the short path, or NotImplemented when the op is not one of ours."""
    if func in FACTORIES:
        device = kwargs.get("device") or _CPU
        if device.type == "meta" or any(isinstance(a, torch.Tensor) for a in args):
            return NotImplemented
        with torch._C._DisableTorchDispatch():
            out = func(*args, **{**kwargs, "device": _META})
        return make(out, device)
    if func in VIEWS or func in FILLS:
        if not args or type(args[0]) is not DeferredTensor or args[0].fake_mode is not fake_mode:
            return NotImplemented
        if any(isinstance(a, torch.Tensor) for a in args[1:]):
            return NotImplemented
        out = _run_meta(fake_mode, func, args, kwargs)
        if func in FILLS:
            return args[0]
        return make(out, args[0].fake_device)
    return NotImplemented
