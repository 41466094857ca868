"""Checkpoint reads as recorded ops: a tensor read from a safetensors file under deferred init is a
fake whose producer is `explorer::read_safetensors(path, key, shape, dtype)`.

Loaders open a file with `safetensors.safe_open` and ask it for a tensor (`get_tensor`, or
`get_slice(key)[...]`, which is how Hugging Face's `from_pretrained` reads); inside a deferred
scope those two calls read only the header (shape, dtype) and return a fake made by a read op. What
the loader then does with it (`.to(dtype)`, renames, concatenations, transposes, `setattr` into the
model) is recorded like any op, so the closure of one layer reaches only that layer's reads, and
materializing reads just those tensors' bytes. Nothing is read while recording.

Note: [safe_open is wrapped where loaders imported it] `safe_open` is a class compiled in Rust, so
its methods cannot be patched; the name is replaced, inside deferred scopes only (restored on every
exit), in every imported module that binds it under that name: `safetensors` itself, loaders
(transformers, diffusers, accelerate) and user code alike bind it at import (`from safetensors
import safe_open`). Which modules do is looked up once per module (`_safe_open_holders`); a module
imported while a recording runs, or one binding it under another name, keeps the original, whose
reads then fail inside the recording.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from ..checkpoint_headers import safetensors_dtype
from ..errors import MaterializationError
from ..hub_fetch import read_remote, remote_file
from . import initializers  # noqa: F401 - defines the `explorer` op namespace this extends
from .file_stamps import stamped
from .lean_fake import register_factory
from .plans import layout_free_arguments
from .scope import recording_graph

_LIBRARY = torch.library.Library("explorer", "FRAGMENT")
_LIBRARY.define(
    "read_safetensors(str path, str key, SymInt[] shape, ScalarType dtype, *, Device? device=None) -> Tensor"
)


def read_tensor(
    path: str, key: str, shape: list[int], dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """The tensor `key` of safetensors file `path`, checked against what was recorded: a file that
    lost the key, or holds it with another shape or dtype, raises MaterializationError naming both.
    A Hub header stub (hub_fetch.py) fetches the tensor's bytes instead."""
    remote = remote_file(path)
    if remote is not None:
        tensor = read_remote(path, remote, key, list(shape), dtype)
        return tensor if device is None or torch.device(device).type == "cpu" else tensor.to(device)
    try:
        with original_safe_open()(path, framework="pt") as handle:
            if key not in handle.keys():
                raise MaterializationError(f"checkpoint {path} no longer holds {key!r} (it did when recorded)")
            tensor = handle.get_tensor(key)
    except MaterializationError:
        raise
    except Exception as error:  # safetensors raises its own SafetensorError, and OSError
        raise MaterializationError(
            f"reading {key!r} from checkpoint {path} failed: {type(error).__name__}: {error}"
        ) from error
    if list(tensor.shape) != list(shape) or tensor.dtype != dtype:
        raise MaterializationError(
            f"checkpoint {path} holds {key!r} as {tensor.dtype} {list(tensor.shape)}, but it was recorded as "
            f"{dtype} {list(shape)}: the file changed since; record again (deferred_init) to use it"
        )
    return tensor if device is None or torch.device(device).type == "cpu" else tensor.to(device)


_LIBRARY.impl("read_safetensors", read_tensor, "CompositeExplicitAutograd")
_LIBRARY.impl(
    "read_safetensors",
    lambda path, key, shape, dtype, device=None: torch.empty(shape, dtype=dtype, device="meta"),
    "Meta",
)

READ_SAFETENSORS = torch.ops.explorer.read_safetensors.default
register_factory(
    READ_SAFETENSORS, lambda path, key, shape, dtype, device=None: torch.empty(shape, dtype=dtype, device=device)
)
layout_free_arguments(READ_SAFETENSORS, (0, 1))  # the file and the key

_ORIGINAL: dict[str, Any] = {}


def original_safe_open() -> Any:
    if "safe_open" not in _ORIGINAL:
        import safetensors

        _ORIGINAL["safe_open"] = safetensors.safe_open
    return _ORIGINAL["safe_open"]


class RecordedSlice:
    """`safe_open(...).get_slice(key)` under deferred init: metadata from the header; indexing it
    records a read of the whole tensor, then the indexing itself."""

    def __init__(self, opened: RecordedSafeOpen, key: str, inner: Any) -> None:
        self._opened, self._key, self._inner = opened, key, inner

    def get_shape(self) -> list[int]:
        return self._inner.get_shape()

    def get_dtype(self) -> str:
        return self._inner.get_dtype()

    def __getitem__(self, index: Any) -> torch.Tensor:
        tensor = self._opened.get_tensor(self._key)
        return tensor if index is Ellipsis or index == slice(None) else tensor[index]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RecordedSafeOpen:
    """`safetensors.safe_open` inside a deferred scope: the header is read now, tensors are read ops.
    Another framework than torch's (`framework="np"`) gets safetensors' own handle: its arrays are
    read for real, as eager reads them, and what torch makes of them is recorded as any outside value."""

    def __new__(cls, filename: Any, framework: str = "pt", device: Any = "cpu", **kwargs: Any) -> Any:
        if framework not in ("pt", "torch"):
            return original_safe_open()(filename, framework=framework, device=device, **kwargs)
        return super().__new__(cls)

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu", **kwargs: Any) -> None:
        self._path = os.path.abspath(os.fspath(filename))
        self._device = torch.device(device if not isinstance(device, int) else f"cuda:{device}")
        self._inner = original_safe_open()(filename, framework=framework, device="cpu", **kwargs)

    def __enter__(self) -> RecordedSafeOpen:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    def keys(self) -> list[str]:
        return self._inner.keys()

    def metadata(self) -> Any:
        return self._inner.metadata()

    def get_slice(self, key: str) -> RecordedSlice:
        return RecordedSlice(self, key, self._inner.get_slice(key))

    def get_tensor(self, key: str) -> torch.Tensor:
        remote = remote_file(self._path)
        if recording_graph() is None and remote is None:  # the handle outlived the scope: read for real
            return self._inner.get_tensor(key).to(self._device)
        header = self._inner.get_slice(key)
        dtype = safetensors_dtype(header.get_dtype())
        if dtype is None:
            raise NotImplementedError(f"deferred reads of {header.get_dtype()} tensors ({key!r} in {self._path})")
        if recording_graph() is None:  # a Hub header stub holds no data: fetch it
            return read_tensor(self._path, key, list(header.get_shape()), dtype, self._device)
        return READ_SAFETENSORS(stamped(self._path), key, list(header.get_shape()), dtype, device=self._device)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {key: self.get_tensor(key) for key in self.keys()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_HF_SYNC_LOAD = "HF_DEACTIVATE_ASYNC_LOAD"


class _SafeOpenHolders:
    """Which imported modules bind safetensors' `safe_open` (see the note): each module is looked at
    once, when `sys.modules` has grown since the last look (its `__dict__` only: a lazy module's
    `__getattr__` could import)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.names: set[str] = set()  # those that bound it when looked at
        self.modules_count = -1

    def __call__(self, original: Any) -> list[Any]:
        modules = sys.modules
        if len(modules) != self.modules_count:
            for name, module in list(modules.items()):
                if name not in self.seen:
                    self.seen.add(name)
                    namespace = getattr(module, "__dict__", None)
                    if isinstance(namespace, dict) and namespace.get("safe_open") is original:
                        self.names.add(name)
            self.modules_count = len(modules)
        holders = [modules.get(name) for name in self.names]
        return [held for held in holders if held is not None and held.__dict__.get("safe_open") is original]


_safe_open_holders = _SafeOpenHolders()


@contextlib.contextmanager
def recorded_checkpoint_reads() -> Iterator[None]:
    """Inside the block, safetensors reads are recorded ops (undone on any exit)."""
    original = original_safe_open()
    patched = _safe_open_holders(original)
    for module in patched:
        module.safe_open = RecordedSafeOpen
    # Hugging Face reads in worker threads, where no recording runs: load in the recording thread.
    async_load = os.environ.get(_HF_SYNC_LOAD)
    os.environ[_HF_SYNC_LOAD] = "1"
    try:
        yield
    finally:
        for module in patched:
            module.safe_open = original
        if async_load is None:
            os.environ.pop(_HF_SYNC_LOAD, None)
        else:
            os.environ[_HF_SYNC_LOAD] = async_load
