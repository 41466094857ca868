"""Refusing foreign code that asks a deferred tensor for its bytes, with the way out.

A fake's memory is a meta storage: it has no address, `np.asarray` has nothing to read, a DLPack
capsule would point at nothing, and savers such as `safetensors.torch.save_file` fail far away with
their own words ("invalid shape, data type, or offset for tensor"). Outside a recording these calls
raise `NoDataError`, naming the tensor and the call and saying to materialize first. Inside one they
keep what they do (`numpy()` reads the true value; see `DeferredTensor.numpy`).

Note: [Addresses of deferred storages]
Constructors compare addresses to find shared memory (`a.data_ptr() == b.data_ptr()`, a set of
`untyped_storage().data_ptr()`, as Hugging Face's and accelerate's tie finders do). A meta storage's
address is 0, so every fake would look tied to every other. Inside a recording each deferred storage
gets an address of its own instead, handed out once per storage, in a range no process maps (from
2**56 up, each storage in a slot of its size or more): equal exactly for views of one storage, with
a view's offset added as eager adds it. They name no memory and outlive nothing: the materialized
tensor has its real address.

Limitations: `torch.utils.dlpack.to_dlpack(t)` is a C function that asks no Python method of the
tensor, so it still returns a capsule pointing at nothing; the buffer protocol (`memoryview(t)`) is
not offered by any tensor, real or fake, so it already fails with Python's own TypeError.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ..errors import NoDataError
from ..naming import format_bytes
from .scope import active_scope
from .source import user_location

if TYPE_CHECKING:
    from ..graph import InitGraph

_GRAPH_ATTR = "_deferred_graph"
_ADDRESS_ATTR = "_deferred_address"

# note [Addresses of deferred storages]
_FIRST_ADDRESS, _SLOT_ALIGNMENT = 1 << 56, 1 << 20
_next_address = _FIRST_ADDRESS
_address_lock = threading.Lock()


def _address_of(storage: torch.UntypedStorage) -> int:
    """The address a deferred storage answers with inside a recording (0 when it holds no bytes, as
    eager's empty storages do)."""
    global _next_address
    size = storage.nbytes()
    if size == 0:
        return 0
    address = storage.__dict__.get(_ADDRESS_ATTR)
    if address is None:
        with _address_lock:
            address = storage.__dict__.setdefault(_ADDRESS_ATTR, _next_address)
            if address == _next_address:
                _next_address += (size // _SLOT_ALIGNMENT + 2) * _SLOT_ALIGNMENT
    return address


def no_data_error(call: str, name: str, graph: InitGraph | None) -> NoDataError:
    """The error for `call` asking the bytes of `name` (a deferred tensor or storage, described)."""
    where = user_location()
    return NoDataError(
        f"{call} needs the bytes of {name}, which is deferred (fake) and has no data yet. Materialize first: "
        "explorer.materialize_module(module) for the whole module, or explorer.materialize_tensor(tensor) for "
        "one tensor" + (f". Asked at {where}" if where is not None else ""),
        graph,
        call=call,
    )


class DeferredStorage(torch.UntypedStorage):
    """The storage object of a `DeferredTensor`: refuses to hand out bytes outside a recording.

    Note: [Deferred storages] PyTorch keeps one Python object per storage for as long as the storage
    lives (PyObject preservation), so `DeferredTensor.untyped_storage()` turns that object into this
    subclass once, in place (`__class__` assignment; the layout is the same), and every later
    `untyped_storage()`, from any view, returns it. Re-check on torch upgrades that storages keep
    their Python object. `torch.is_storage` is False for it (it compares exact types), which only
    routes pickling to `__reduce__` below.
    """

    @classmethod
    def adopt(cls, storage: torch.UntypedStorage, graph: InitGraph | None) -> DeferredStorage:
        """`storage` as a DeferredStorage of `graph` (held weakly, to name the storage in errors; a
        weak reference to a tensor instead would stop `torch.utils.swap_tensors` on it)."""
        if type(storage) is not cls:
            storage.__class__ = cls
        if graph is not None and _GRAPH_ATTR not in storage.__dict__:
            storage.__dict__[_GRAPH_ATTR] = weakref.ref(graph)
        return storage  # type: ignore[return-value]  # its __class__ is cls now; mypy can't see it

    def _refuse(self, call: str) -> None:
        if active_scope() is None:
            graph_ref = self.__dict__.get(_GRAPH_ATTR)
            graph = graph_ref() if graph_ref is not None else None

            raise no_data_error(call, describe_storage(self, graph), graph)

    def data_ptr(self) -> int:  # see the class; note [Addresses of deferred storages]
        self._refuse("UntypedStorage.data_ptr()")
        return _address_of(self)

    def __getitem__(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("UntypedStorage.__getitem__")
        return super().__getitem__(*args, **kwargs)

    def __iter__(self) -> Any:  # also what bytes(storage) and list(storage) call
        self._refuse("iterating an UntypedStorage (bytes(storage), list(storage))")
        return super().__iter__()

    def tolist(self) -> list:
        self._refuse("UntypedStorage.tolist()")
        return super().tolist()

    def cpu(self) -> torch.UntypedStorage:
        self._refuse("UntypedStorage.cpu()")
        return super().cpu()

    def __reduce__(self) -> Any:  # pickle and torch.save of the storage itself
        self._refuse("pickling an UntypedStorage (pickle, torch.save)")
        return super().__reduce__()


def deferred_data_ptr(tensor: torch.Tensor, storage: torch.UntypedStorage) -> int:
    """`tensor.data_ptr()` of a deferred tensor inside a recording: its storage's address plus its
    offset in bytes (note [Addresses of deferred storages])."""
    base = _address_of(storage)
    return base + int(tensor.storage_offset()) * tensor.element_size() if base else 0


def describe_storage(storage: torch.UntypedStorage, graph: InitGraph | None) -> str:
    """ "the storage of parameter 'w' (48 B)": named by the first parameter or buffer on it in the
    module `graph` built; "a deferred storage (48 B)" when none is."""
    size = format_bytes(storage.nbytes())
    for kind, name, candidate in named_tensors_of(graph):
        if torch.Tensor.untyped_storage(candidate)._cdata == storage._cdata:
            return f"the storage of {kind} {name!r} ({size})"
    return f"a deferred storage ({size})"


def named_tensors_of(graph: InitGraph | None) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, name, tensor) of the parameters and buffers of the module `graph` built, while it lives."""
    root = graph.root() if graph is not None and graph.root is not None else None
    if root is None:
        return []
    return [
        (kind, name, candidate)
        for kind, named in (("parameter", root.named_parameters), ("buffer", root.named_buffers))
        for name, candidate in named(remove_duplicate=False)
    ]


def module_holds(graph: InitGraph | None, tensor: torch.Tensor) -> bool:
    """Whether `tensor` itself (not an equal view) is a parameter or buffer of the module `graph`
    built, while it lives. One pass over the modules' own tables: callers ask it once per view."""
    root = graph.root() if graph is not None and graph.root is not None else None
    if root is None:
        return False
    stack: list[torch.nn.Module | None] = [root]
    while stack:  # plain loops, not root.modules() or any(): callers ask once per view
        module = stack.pop()
        if module is None:  # a child slot set to None
            continue
        for table in (module._parameters, module._buffers):
            for candidate in table.values():
                if candidate is tensor:
                    return True
        stack.extend(module._modules.values())
    return False
