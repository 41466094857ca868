"""`torch.save` files and `torch.distributed.checkpoint` directories as recorded reads.

As safetensors reads (record/checkpoint_reads.py), a tensor from these formats is a fake made by a
read op while recording: `explorer::read_torch(path, key, shape, dtype)` for a `torch.save` file,
`explorer::read_dcp(path, key, shape, dtype)` for a DCP directory. `torch.load(path, ...)` inside a
deferred scope reads the pickle with `map_location="meta"` (shapes and dtypes, never tensor bytes,
and with `weights_only` as given: a pickle that carries code is refused by torch as always) and
hands back read ops; materializing runs `torch.load(path, mmap=True, weights_only=True)` and takes
the key (memory mapped: only the tensors asked for are read), or `dcp.load` of that key alone.

Limits: a read tensor is contiguous and owns its memory (a tensor saved as a view of another comes
back as a copy, as safetensors gives it); `torch.load` of a file object or with `weights_only=False`
reads for real, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import MaterializationError
from . import initializers  # noqa: F401 - defines the `explorer` op namespace this extends
from .file_stamps import stamped
from .scope import outside_recording, recording_graph

_LIBRARY = torch.library.Library("explorer", "FRAGMENT")
for _name in ("read_torch", "read_dcp"):
    _LIBRARY.define(f"{_name}(str path, str key, SymInt[] shape, ScalarType dtype, *, Device? device=None) -> Tensor")

_LOADED: OrderedDict[tuple, Any] = OrderedDict()  # (path, size, mtime) → mmap-backed torch.load result
_LOADED_FILES = 4


def _loaded(path: str) -> Any:
    stat = os.stat(path)
    stamp = (path, stat.st_size, stat.st_mtime_ns)
    found = _LOADED.get(stamp)
    if found is None:
        # memory mapped (only the tensors asked for are read), except the pre-1.6 format, which
        # torch.load maps only in its zip form: read whole, as eager reads it
        mapped = zipfile.is_zipfile(path)
        found = _LOADED[stamp] = ORIGINAL_LOAD(path, mmap=mapped, weights_only=True, map_location="cpu")
        while len(_LOADED) > _LOADED_FILES:
            _LOADED.popitem(last=False)
    return found


def torch_key(path: list) -> str:
    """A read's key: the keys and indices from the top of a torch.save structure to the tensor, as
    JSON (a tuple key, which JSON has not, as {"tuple": [...]}; `key_path` reads it back)."""

    def encoded(part: Any) -> Any:
        return {"tuple": [encoded(item) for item in part]} if isinstance(part, tuple) else part

    return json.dumps([encoded(part) for part in path])


def key_path(key: str) -> list:
    """The keys and indices `torch_key` encoded."""
    return json.loads(key, object_hook=lambda value: tuple(value["tuple"]) if set(value) == {"tuple"} else value)


def _walk(structure: Any, path: list) -> Any:
    for part in path:
        structure = structure[part]
    return structure


def _checked(tensor: Any, where: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or list(tensor.shape) != list(shape) or tensor.dtype != dtype:
        found = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise MaterializationError(
            f"{where} is now {found}, but it was recorded as {dtype} {list(shape)}: the file "
            "changed since; record again (deferred_init) to use it"
        )
    return tensor


def read_torch(path: str, key: str, shape: list[int], dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    """Tensor `key` (a JSON list of keys from the top of the pickled structure) of torch.save file `path`,
    in memory of its own, as torch.load gives it."""
    tensor = torch_file_tensor(path, key, shape, dtype)
    if device is not None and torch.device(device).type != "cpu":
        return tensor.to(device, memory_format=torch.contiguous_format)
    # The file's tensor is one object for every read of the key, in every model and every
    # materialization, and its memory map is writable: each read gets a copy.
    return tensor.clone(memory_format=torch.contiguous_format)


def torch_file_tensor(path: str, key: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Tensor `key` of torch.save file `path` as the file's cached memory map holds it: shared by every
    reader, so read it without writing (rows are copied out of it: replay/rows.py)."""
    try:
        tensor = _walk(_loaded(path), key_path(key))
    except (KeyError, IndexError, TypeError) as error:
        raise MaterializationError(f"checkpoint {path} no longer holds {key} (it did when recorded)") from error
    except Exception as error:  # torch.load raises many kinds on a damaged file
        raise MaterializationError(
            f"reading {key} from checkpoint {path} failed: {type(error).__name__}: {error}"
        ) from error
    return _checked(tensor, f"{key} of checkpoint {path}", shape, dtype)


def read_dcp(path: str, key: str, shape: list[int], dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    """Tensor `key` of the torch.distributed.checkpoint directory `path`, read alone."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state = {key: torch.empty(shape, dtype=dtype)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
            dcp.load(state, checkpoint_id=path, no_dist=True)
    except (Exception, CheckpointException) as error:  # a BaseException, wrapping each rank's cause
        cause = _dcp_cause(error)
        raise MaterializationError(
            f"reading {key!r} from checkpoint {path} failed: {type(cause).__name__}: {cause}"
        ) from error
    tensor = _checked(state[key], f"{key!r} of checkpoint {path}", shape, dtype)  # fresh: dcp.load filled it
    return tensor if device is None or torch.device(device).type == "cpu" else tensor.to(device)


def _dcp_cause(error: BaseException) -> BaseException:
    """The exception DCP gathered from this (the only) process, else `error` itself."""
    failures = getattr(error, "failures", None)
    own = failures.get(0) if isinstance(failures, dict) else None
    if own is None:
        return error
    return own[0] if isinstance(own, tuple) else own


def _meta(path: str, key: str, shape: list[int], dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


for _name, _kernel in (("read_torch", read_torch), ("read_dcp", read_dcp)):
    _LIBRARY.impl(_name, _kernel, "CompositeExplicitAutograd")
    _LIBRARY.impl(_name, _meta, "Meta")

READ_TORCH = torch.ops.explorer.read_torch.default
READ_DCP = torch.ops.explorer.read_dcp.default
ORIGINAL_LOAD = torch.load  # torch.load itself (what the scope's wrapper stands in for)


def recorded_read(op: Any, path: str, key: str, like: torch.Tensor, device: Any) -> torch.Tensor:
    """A read op for a tensor shaped like `like` (a meta tensor or a header's fake), inside a recording."""
    return op(stamped(path), key, list(like.shape), like.dtype, device=device)


def _replace_tensors(structure: Any, path: str, at: list, device: Any) -> Any:
    if isinstance(structure, torch.Tensor):
        read = recorded_read(READ_TORCH, path, torch_key(at), structure, device)
        if isinstance(structure, torch.nn.Parameter):  # torch.load gives back what was saved
            return torch.nn.Parameter(read, requires_grad=structure.requires_grad)
        return read.requires_grad_() if structure.requires_grad else read
    if isinstance(structure, dict):
        return type(structure)((k, _replace_tensors(v, path, [*at, k], device)) for k, v in structure.items())
    if isinstance(structure, (list, tuple)):
        return type(structure)(_replace_tensors(v, path, [*at, i], device) for i, v in enumerate(structure))
    return structure


def _recorded_load(
    f: Any,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    **kwargs: Any,
) -> Any:
    """`torch.load` inside a deferred scope: the pickle is read, tensors are read ops (see the module note)."""
    plain = (
        recording_graph() is None
        or not isinstance(f, (str, os.PathLike))
        or weights_only is False
        or pickle_module is not None
        or kwargs
        or map_location in ("meta", torch.device("meta"))
    )
    if plain:
        # what eager gives (real or meta tensors); unpickling's `set_` onto the file's storages is
        # not an op of the model (transformers reads a `.bin` on meta for its dtype)
        with outside_recording():
            return ORIGINAL_LOAD(
                f,
                map_location=map_location,
                pickle_module=pickle_module,
                weights_only=weights_only,
                mmap=mmap,
                **kwargs,
            )
    path = os.path.abspath(os.fspath(f))
    structure = meta_load(path)
    device = map_location if isinstance(map_location, (str, torch.device)) else None
    return _replace_tensors(structure, path, [], device)


def meta_load(path: str) -> Any:
    """What torch.save stored at `path`, its tensors on the meta device: the pickle is read, no
    tensor bytes; `weights_only` (code is refused). Unpickling runs tensor ops (`set_` onto the
    file's storages), which must not be recorded: it runs outside the recording."""
    with outside_recording():
        return ORIGINAL_LOAD(path, map_location="meta", weights_only=True)


@contextlib.contextmanager
def recorded_torch_load() -> Iterator[None]:
    """Inside the block, `torch.load` of a file gives read ops (undone on any exit)."""
    previous = torch.load
    torch.load = _recorded_load
    try:
        yield
    finally:
        torch.load = previous
