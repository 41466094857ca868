"""The fake tensors users hold: FakeTensors that know which recorded graph and tensor id they are.

`deferred_init` turns every FakeTensor it sees come out of an op into a `DeferredTensor` (a
FakeTensor subclass that only changes how it prints) and tags it with a `DeferredHandle`. The
handle holds the graph strongly; the graph never holds a fake, so dropping the module frees the
graph.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._torch_compat.dispatch import never_traced_by_dynamo, tree_flatten
from .._torch_compat.fake import FakeTensor, fake_instance_attributes
from ..naming import dtype_name
from .no_data import DeferredStorage, deferred_data_ptr, named_tensors_of, no_data_error
from .parameter_classes import PARAMETER_CLASS_ATTR
from .scope import active_scope, outside_recording, recording_graph

if TYPE_CHECKING:
    from ..graph import InitGraph, TensorId

HANDLE_ATTR = "_deferred_handle"


def version_of(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter, or None for an inference tensor (it has none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


@dataclass(slots=True)
class DeferredHandle:
    """Which graph a fake tensor belongs to, which tensor id it currently is, and its version then
    (None for an inference tensor, which has no version counter)."""

    graph: InitGraph
    tensor_id: TensorId
    version: int | None


class DeferredTensor(FakeTensor):
    """A FakeTensor recorded by `deferred_init`: prints with its metadata and `fake=True`, and ops
    on it after `deferred_init` returned are recorded into its graph (see record/extension.py)."""

    # FakeTensor gives each instance these attributes, all None until fake mode's memos fill them;
    # here they are None on the class instead, so that the fakes recording makes by the thousand
    # carry a small dict (`lean_fake.FakeFactory` leaves out what the class already says).
    # Re-check the list on upgrades: a name missing here just stays per instance.
    constant = pytype = dispatch_keys = real_tensor = None
    _nonzero_memo = _nonzero_memo_vc = _nonzero_memo_epoch = None
    _item_memo = _item_memo_vc = _item_memo_epoch = None
    _unique_memo = _unique_memo_vc = _unique_memo_epoch = None
    _unique_consecutive_memo = _unique_consecutive_memo_vc = _unique_consecutive_memo_epoch = None
    _nested_int_memo = _nested_int_memo_vc = _nested_int_memo_epoch = None

    @staticmethod
    def __new__(cls: type[DeferredTensor], *args: Any, **kwargs: Any) -> Any:
        """FakeTensor's constructor; and PyTorch's re-wrap idiom `type(p)(data, requires_grad=...,
        **p.__dict__)`, which accelerate's `init_empty_weights` and `set_module_tensor_to_device` and
        transformers 4's `from_pretrained` apply to every parameter. For a deferred `p` it gives what
        it gives for an eager one (note [Re-wrapping a deferred tensor])."""
        if len(args) != 1 or not isinstance(args[0], torch.Tensor):
            return FakeTensor.__new__(cls, *args, **kwargs)
        return _rewrapped(args[0], kwargs)

    @classmethod
    @never_traced_by_dynamo  # note [A deferred model under torch.compile]
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # Note: [A deferred model under torch.compile]
        # `torch.compile(model)(x)` on a deferred model does what `model(x)` does: the forward is
        # recorded and its output is fake. Dynamo cannot trace the recorder (it would compile the
        # handler's own frames, and AOT autograd's RNG save/restore then meets a fake generator
        # state: "Invalid mt19937 state"), so this handler runs untraced, as a graph break. Once
        # the model is materialized the same compiled module compiles its real forward.
        kwargs = kwargs or {}
        if active_scope() is None:  # during deferred_init the recording mode sees ops first
            recorder = _recorder_of(args, kwargs)
            if recorder is not None:
                return recorder.run(func, args, kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __repr__(self) -> str:  # type: ignore[override]  # no tensor_contents: the format is the documented API
        parts = [f"size={tuple(self.shape)}", f"device='{self.device}'"]
        if self.dtype != torch.get_default_dtype():
            parts.append(f"dtype={self.dtype}")
        if self.requires_grad:
            parts.append("requires_grad=True")
        return f"tensor(..., {', '.join(parts)}, fake=True)"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        """As `Tensor.__format__`: a 0-d tensor (not a parameter) formats its value, `f"{loss:.4f}"`.
        Inside the deferred_init that made it that is eager's value; elsewhere a format spec is
        NoDataError (no value until materialized), and no spec gives the fake's repr."""
        if self.dim() == 0 and not isinstance(self, torch.nn.Parameter):
            handle, scope = handle_of(self), active_scope()
            if handle is not None and scope is not None and scope.graph is handle.graph:
                real = scope.read_value(self)
                with outside_recording():
                    return real.item().__format__(format_spec)
            if format_spec:
                graph = handle.graph if handle is not None else None
                raise no_data_error(f"format(tensor, {format_spec!r})", describe(self), graph)
        return object.__format__(self, format_spec)

    def numpy(self, *, force: bool = False):  # numpy is optional for users
        """Inside the deferred_init that made it: the true values (as eager construction has them), in
        a read-only array: eager's shares the tensor's memory, and a write into this one could not
        reach the tensor. Elsewhere: NoDataError, since a fake tensor has no data until it is
        materialized."""
        return self._values_for_numpy("Tensor.numpy()", force)

    def __array__(self, dtype: Any = None, copy: bool | None = None):  # np.asarray / np.array
        """As `Tensor.__array__` (`numpy()`, then `dtype`). numpy 2's `copy` is accepted and ignored:
        the values are computed afresh, so there is no memory to share or to copy."""
        array = self._values_for_numpy("numpy.asarray(tensor) (Tensor.__array__)", False)
        return array if dtype is None else array.astype(dtype, copy=False)

    def _values_for_numpy(self, call: str, force: bool):
        handle = handle_of(self)
        scope = active_scope()
        if handle is None or scope is None or scope.graph is not handle.graph:
            raise no_data_error(call, describe(self), handle.graph if handle is not None else None)
        real = scope.read_value(self)
        with outside_recording():
            array = real.numpy(force=force)
        # Eager's array is the tensor's memory, so writes into it change the tensor; this one is
        # the values, made afresh: refused (numpy's "read-only" error) rather than silently lost.
        array.flags.writeable = False
        return array

    def data_ptr(self) -> int:
        """Inside a recording, an address of the tensor's own (distinct storages differ, views of one
        storage are offset as in eager: note [Addresses of deferred storages]); outside one,
        NoDataError, since the caller means to read bytes (`safetensors.torch.save_file` does)."""
        self._refuse_bytes_outside_recording("Tensor.data_ptr()")
        return deferred_data_ptr(self, self.untyped_storage())

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:  # np.from_dlpack, torch.from_dlpack
        self._refuse_bytes_outside_recording("Tensor.__dlpack__() (from_dlpack)")
        return super().__dlpack__(*args, **kwargs)

    def share_memory_(self) -> DeferredTensor:
        """Outside a recording, NoDataError (`Module.share_memory()` on a deferred model: a fake has
        no memory to share; materialize first). Inside one, nothing to do: where the values will
        live does not change them, and the materialized tensor is not in shared memory."""
        self._refuse_bytes_outside_recording("Tensor.share_memory_() (Module.share_memory)")
        return self

    def untyped_storage(self) -> torch.UntypedStorage:
        """The storage, as a `DeferredStorage` that refuses to hand out bytes outside a recording
        (see note [Deferred storages] in record/no_data.py)."""
        handle = handle_of(self)
        return DeferredStorage.adopt(super().untyped_storage(), handle.graph if handle is not None else None)

    def _refuse_bytes_outside_recording(self, call: str) -> None:
        if active_scope() is None:
            handle = handle_of(self)
            raise no_data_error(call, describe(self), handle.graph if handle is not None else None)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickling (`pickle`, `torch.save`) is refused with the fix: a fake has no data, and the
        recording it replays from holds live objects (ops, real tensors by reference, weak caches)
        that would not mean the same in another process."""
        raise TypeError(
            f"cannot pickle {describe(self)}: it is a deferred (fake) tensor with no data. Materialize "
            "first (explorer.materialize_module(module), then torch.save / pickle), or pickle the recipe "
            "(the module class and its arguments) and call deferred_init again where you load it"
        )

    def __deepcopy__(self, memo: dict[Any, Any]) -> torch.Tensor:
        """`copy.deepcopy` of a fake (inside a constructor, as `nn.Transformer` clones its layers, or
        after deferred_init, as an EMA or teacher copy of a model is made): the copy is made of
        recorded ops, as eager makes it, so it materializes to the values the source had when it was
        copied. A parameter clones its data, as `nn.Parameter.__deepcopy__` does; any other tensor
        copies its whole storage once per deepcopy and keeps its layout, as `Tensor.__deepcopy__`
        does, so views copied together still share memory. TypeError inside another recording (the
        copy would belong to neither) or while this one's constructor still runs on another thread.
        """
        if id(self) in memo:
            return memo[id(self)]
        handle = handle_of(self)
        current = recording_graph()
        if handle is None or current is not handle.graph and (current is not None or handle.graph.recorder is None):
            raise TypeError(
                f"copy.deepcopy of {describe(self)}: "
                + (
                    "it belongs to another deferred recording than the one running here; copy it outside this block"
                    if current is not None
                    else "its recording is still running (or failed); copy it once deferred_init has returned"
                )
            )
        if not self.is_leaf:
            raise RuntimeError(  # eager's rule and wording (Tensor.__deepcopy__)
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol "
                "at the moment."
            )
        result: torch.Tensor
        with torch.no_grad():
            if isinstance(self, torch.nn.Parameter):
                data = self.data.clone(memory_format=torch.preserve_format)
                result = torch.nn.Parameter(data, self.requires_grad)
                if PARAMETER_CLASS_ATTR in self.__dict__:  # eager's copy is `type(self)(...)`
                    result.__dict__[PARAMETER_CLASS_ATTR] = self.__dict__[PARAMETER_CLASS_ATTR]
            else:
                result = _copy_keeping_storage(self, memo)
                if self.requires_grad:
                    result.requires_grad_()
                if self.grad is not None:
                    result.grad = copy.deepcopy(self.grad, memo)
                for key, value in self.__dict__.items():
                    if key not in result.__dict__:  # user attributes; not fake-mode state or our handle
                        result.__dict__[key] = copy.deepcopy(value, memo)
        memo[id(self)] = result
        return result


def _copy_keeping_storage(tensor: torch.Tensor, memo: dict[Any, Any]) -> torch.Tensor:
    """A copy of `tensor`'s whole storage (made once per deepcopy call), viewed with its layout and
    dtype: a dtype view (`a.view(torch.int32)`) copied with `a` shares the copy's memory, as eager's."""
    key = ("explorer.deepcopy.storage", tensor.untyped_storage()._cdata)
    flat_bytes = memo.get(key)
    if flat_bytes is None:
        numel = tensor.untyped_storage().nbytes() // tensor.element_size()
        flat_bytes = memo[key] = tensor.as_strided((numel,), (1,), 0).clone().view(torch.uint8)
    return flat_bytes.view(tensor.dtype).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def describe(tensor: torch.Tensor) -> str:
    """'parameter 'layers.0.weight' (shape (4, 3), float32)': the tensor's name in the module
    deferred_init returned when it is still there; 'an alias of parameter ...' for a view with the
    same layout (what `state_dict()` and `.data` hand out); else its shape and dtype."""
    layout = f"shape {tuple(tensor.shape)}, {dtype_name(tensor.dtype)}"
    handle = handle_of(tensor)
    named = named_tensors_of(handle.graph if handle is not None else None)
    for kind, name, candidate in named:
        if candidate is tensor:
            return f"{kind} {name!r} ({layout})"
    for kind, name, candidate in named:
        if _same_view(candidate, tensor):
            return f"an alias of {kind} {name!r} ({layout})"
    return f"a deferred tensor ({layout})"


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same storage, dtype, shape, stride and offset: one is an alias of the other."""
    return (
        torch.Tensor.untyped_storage(a)._cdata == torch.Tensor.untyped_storage(b)._cdata
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


# Note: [Re-wrapping a deferred tensor]
# Eager code re-wraps data as a parameter's class: `type(p)(data, requires_grad=r, **p.__dict__)`
# (accelerate's `init_empty_weights`, transformers 4's loading) or `type(p)(data, requires_grad=r)`
# (accelerate's `set_module_tensor_to_device`). For a plain parameter, whose `__dict__` is empty,
# that is `nn.Parameter(data, r)`. A deferred `p` is a DeferredTensor whose `__dict__` holds fake
# state (FakeTensor's instance attributes, the handle, `_is_param`), so the call would reach
# FakeTensor's constructor with state it refuses. It means the eager call instead: the fake state is
# dropped and anything else in `__dict__` (a user's or a library's attribute) is passed on as eager
# passes it, so a keyword `nn.Parameter` does not take fails as it fails eagerly. Parameters and
# buffers share the class, so the call is read as a parameter's when it says so (`_is_param` from
# `__dict__`, or `requires_grad=`, which `torch.Tensor(other)` does not take); a bare
# `type(t)(data)` is refused, naming both readings. `data` may be fake (recorded as
# `nn.Parameter(data)` is) or real (a real parameter, as in eager).
_FAKE_STATE = frozenset({HANDLE_ATTR, "_is_param", PARAMETER_CLASS_ATTR})


def _rewrapped(data: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    state = _without_fake_state(kwargs)
    if kwargs.get("_is_param") or "requires_grad" in kwargs:
        made_as = kwargs.get(PARAMETER_CLASS_ATTR, torch.nn.Parameter)  # eager calls that class
        out = made_as(data, **state)
        if made_as is not torch.nn.Parameter and isinstance(out, FakeTensor):
            out.__dict__[PARAMETER_CLASS_ATTR] = made_as
        return out
    raise TypeError(
        f"type(t)(data) with t deferred and data of shape {tuple(data.shape)}, {dtype_name(data.dtype)}: "
        "deferred parameters and buffers share one class, so say which is meant: for a parameter pass "
        "requires_grad= (as nn.Parameter(data, requires_grad)); for a buffer's torch.Tensor(data), use "
        "data.view_as(data)"
    )


def user_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """What a user or a library set on deferred `tensor` (`p._no_weight_decay = True`, Hugging Face's
    `_is_hf_initialized`): its instance attributes less the fake's own state. Materialization puts
    them on the real tensor, where eager construction has them."""
    return _without_fake_state(tensor.__dict__)


# Where `register_hook` and `register_post_accumulate_grad_hook` keep a tensor's hooks: C-level
# attributes of the tensor object (not in its `__dict__`), whose setters register them with autograd.
_GRADIENT_HOOK_ATTRIBUTES = ("_backward_hooks", "_post_accumulate_grad_hooks")


def carry_gradient_hooks(source: torch.Tensor, target: torch.Tensor) -> None:
    """The gradient hooks registered on `source` (a mask on an embedding's gradient, a
    post-accumulate step) registered on `target` too: the same hook dicts, so a handle taken on
    either removes the hook from both. Materialization hands them from a fake to its real tensor,
    where eager construction has them; a release hands them back."""
    for name in _GRADIENT_HOOK_ATTRIBUTES:
        hooks = getattr(source, name, None)
        if hooks and getattr(target, name, None) is not hooks:
            setattr(target, name, hooks)


def _without_fake_state(attributes: dict[str, Any]) -> dict[str, Any]:
    """`attributes` (a fake's `__dict__`, or the keywords built from it) less the fake's own state."""
    return {k: v for k, v in attributes.items() if k not in _FAKE_STATE and k not in fake_instance_attributes()}


def _recorder_of(args: tuple, kwargs: dict) -> Any:
    """The recorder of the finished graph that the fakes among an op's arguments belong to."""
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, FakeTensor):
            handle = value.__dict__.get(HANDLE_ATTR)
            if handle is not None and handle.graph.recorder is not None:
                return handle.graph.recorder
    return None


def is_fake(tensor: object) -> bool:
    """True for any fake tensor (ours or another FakeTensorMode's): it has metadata but no storage."""
    return isinstance(tensor, FakeTensor)


def handle_of(tensor: object) -> DeferredHandle | None:
    """The recording handle of a fake tensor made under `deferred_init`, or None."""
    if not isinstance(tensor, FakeTensor):
        return None
    return tensor.__dict__.get(HANDLE_ATTR)
