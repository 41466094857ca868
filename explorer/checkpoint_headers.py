"""What a checkpoint holds, read from its headers only: every key with its shape, dtype and file.

Layouts read (`read_headers`):
- a safetensors file: its 8-byte little-endian header length and JSON header, nothing after them
  (see note [Safetensors header]);
- an index (`model.safetensors.index.json`, `pytorch_model.bin.index.json`, as `save_pretrained`
  writes them): its `weight_map`, then the header of every shard it names;
- a `torch.save` file (`.pt`, `.bin`): `torch.load(weights_only=True, map_location="meta")`, which
  refuses pickled code and, for the zip format, creates meta storages without reading the data
  records (torch/serialization.py, `load_tensor`). The pre-1.6 format keeps data inside the pickle
  stream, so that one is read in full (still without running code);
- a `torch.distributed.checkpoint` directory: its `.metadata` file (see note [DCP metadata]).

A directory is looked into: `.metadata` (DCP), then `model.safetensors.index.json`,
`model.safetensors`, `pytorch_model.bin.index.json`, `pytorch_model.bin`, then the one
`*.index.json` or the one `*.safetensors` it holds. Every failure is a `CheckpointError` naming
the file (and the key, where one is at fault).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from .errors import CheckpointError
from .naming import dtype_name

CheckpointFormat = Literal["safetensors", "torch.save", "dcp"]
# In transformers' order (`from_pretrained`): a single file before an index beside it.
DIRECTORY_CANDIDATES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint.filesystem's metadata file name
MAX_HEADER_BYTES = 100_000_000  # safetensors refuses larger headers too
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80

# Safetensors dtype codes → torch dtype attribute names (mirrors `safetensors.torch._TYPES`; re-check
# on upgrades). Codes torch cannot hold as one element per shape entry (F4, F6_*) stay as written.
_SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
_TORCH_DTYPES = {code: getattr(torch, name) for code, name in _SAFETENSORS_DTYPES.items() if hasattr(torch, name)}


def safetensors_dtype(code: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype code ("BF16" → torch.bfloat16); None for a code torch
    cannot hold one element per shape entry of (F4, F6_*) or does not know."""
    return _TORCH_DTYPES.get(code)


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One key of a checkpoint, as its header describes it."""

    key: str
    shape: tuple[int, ...] | None  # None: not a tensor (DCP bytes, a non-tensor value of a torch.save dict)
    dtype: str | None  # as `naming.dtype_name` spells it; a safetensors code torch lacks stays as written
    file: str  # the file holding it, relative to the checkpoint's directory


@dataclass(frozen=True)
class CheckpointHeaders:
    """Every key of one checkpoint. `files`: what was read, relative to the checkpoint's directory
    (the path itself when it is one, else its parent); `index`: the index file of a sharded one."""

    path: str
    format: CheckpointFormat
    files: tuple[str, ...]
    entries: dict[str, CheckpointEntry]
    index: str | None = None


def read_headers(path: str | os.PathLike) -> CheckpointHeaders:
    """The keys, shapes and dtypes of the checkpoint at `path` (a file or directory; see the module
    docstring), reading headers and metadata only. Raises CheckpointError naming the file when the
    path does not exist, holds no checkpoint, or a header is cut short, malformed or names a file
    that is not there."""
    path = Path(path)
    if path.is_dir():
        return _read_directory(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    return _read_file(path, path.parent)


def _read_directory(directory: Path) -> CheckpointHeaders:
    if (directory / DCP_METADATA).is_file():
        return _read_dcp(directory)
    for name in DIRECTORY_CANDIDATES:
        if (directory / name).is_file():
            return _read_file(directory / name, directory)
    for pattern in ("*.index.json", "*.safetensors"):
        found = sorted(directory.glob(pattern))
        if len(found) == 1:
            return _read_file(found[0], directory)
    held = sorted(p.name for p in directory.iterdir())
    listing = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "") or "nothing"
    raise CheckpointError(
        f"{directory}: no checkpoint found: expected model.safetensors, model.safetensors.index.json, "
        f"pytorch_model.bin, a single *.safetensors or *.index.json, or a DCP {DCP_METADATA}; it holds {listing}"
    )


def _read_file(file: Path, root: Path) -> CheckpointHeaders:
    if file.name.endswith(".json"):
        return _read_index(file, root)
    kind = file_format(file)
    entries = _safetensors_entries(file, root) if kind == "safetensors" else _torch_entries(file, root)
    return CheckpointHeaders(str(file), kind, (_relative(file, root),), entries)


def _relative(file: Path, root: Path) -> str:
    return os.path.relpath(file, root)


def file_format(file: Path) -> CheckpointFormat:
    """safetensors or torch.save, from the first bytes (the suffix decides only a damaged file).
    Raises CheckpointError naming a file that is neither."""
    with open(file, "rb", buffering=0) as stream:
        head = stream.read(9)
    size = file.stat().st_size
    if len(head) == 9 and head[8:9] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size:
        return "safetensors"
    if file.suffix == ".safetensors":
        return "safetensors"  # damaged: reading it names the fault
    if head.startswith(_ZIP_MAGIC) or head[:1] == bytes([_PICKLE_PROTO]):
        return "torch.save"
    raise CheckpointError(
        f"{file}: not a checkpoint: neither a safetensors file nor a torch.save file (.pt/.bin); "
        "a directory may also be given (sharded index, DCP)"
    )


# -- safetensors -----------------------------------------------------------------------------------

# Note: [Safetensors header]
# A safetensors file is an 8-byte little-endian length N, N bytes of JSON, then the tensor data.
# The JSON maps each key to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data
# part), plus an optional "__metadata__" of strings. The header is read unbuffered, so not one byte
# of the data part is read; the data part's length comes from the file's size, which is how a file
# cut short (an interrupted download) is told apart from a whole one.


def _read_safetensors_header(file: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the length of its data part, in bytes."""
    size = file.stat().st_size
    with open(file, "rb", buffering=0) as stream:
        length_field = stream.read(8)
        if len(length_field) < 8:
            raise CheckpointError(f"{file}: not a safetensors file: {size} bytes, fewer than its 8-byte header length")
        length = int.from_bytes(length_field, "little")
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(
                f"{file}: safetensors header cut short or corrupt: its length field says {length:,} bytes, "
                f"the file holds {size - 8:,} after it"
            )
        text = stream.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file}: safetensors header is not valid JSON: {error}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: safetensors header is a JSON {type(header).__name__}, not an object")
    return header, size - 8 - length


def _safetensors_entries(file: Path, root: Path) -> dict[str, CheckpointEntry]:
    header, data_bytes = _read_safetensors_header(file)
    name = _relative(file, root)
    entries: dict[str, CheckpointEntry] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        shape, code, (begin, end) = _safetensors_fields(file, key, info)
        if end > data_bytes:
            raise CheckpointError(
                f"{file}: truncated: tensor {key!r} ends at byte {end:,} of the data, but the file holds "
                f"{data_bytes:,} bytes of data (an interrupted download or copy?)"
            )
        dtype = safetensors_dtype(code)
        if dtype is not None:
            numel = 1
            for size in shape:
                numel *= size
            if numel * dtype.itemsize != end - begin:
                raise CheckpointError(
                    f"{file}: safetensors header entry {key!r}: shape {list(shape)} of {code} needs "
                    f"{numel * dtype.itemsize:,} bytes, its data_offsets span {end - begin:,}"
                )
        entries[key] = CheckpointEntry(key, shape, dtype_name(dtype) if dtype is not None else code, name)
    return entries


def _safetensors_fields(file: Path, key: str, info: Any) -> tuple[tuple[int, ...], str, tuple[int, int]]:
    def malformed(why: str) -> CheckpointError:
        return CheckpointError(f"{file}: safetensors header entry {key!r} is malformed: {why}")

    if not isinstance(info, dict):
        raise malformed(f"a JSON {type(info).__name__}, not an object")
    shape, code, offsets = info.get("shape"), info.get("dtype"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise malformed(f"shape {shape!r} is not a list of sizes")
    if not isinstance(code, str):
        raise malformed(f"dtype {code!r} is not a string")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise malformed(f"data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
    return tuple(shape), code, (offsets[0], offsets[1])


def safetensors_offsets(file: str | os.PathLike) -> dict[str, int]:
    """Where each tensor's data starts in safetensors file `file`, in bytes from the file's start
    (8 + header length + its `data_offsets` begin; see note [Safetensors header]). Reads the header
    only; raises CheckpointError naming the file as `read_headers` does."""
    return {key: begin for key, (begin, _) in safetensors_spans(file).items()}


def safetensors_spans(file: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """Where each tensor's data lies in safetensors file `file`: [begin, end) in bytes from the
    file's start. Reads the header only; raises CheckpointError as `read_headers` does."""
    file = Path(file)
    header, data_bytes = _read_safetensors_header(file)
    start = file.stat().st_size - data_bytes  # where the data part begins
    spans = {}
    for key, info in header.items():
        if key != "__metadata__":
            begin, end = _safetensors_fields(file, key, info)[2]
            spans[key] = (start + begin, start + end)
    return spans


# -- sharded index ---------------------------------------------------------------------------------


def _read_index(index: Path, root: Path) -> CheckpointHeaders:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise CheckpointError(f"{index}: not a checkpoint index: {error}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f'{index}: no "weight_map" object mapping keys to shard files')
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(key)
    entries: dict[str, CheckpointEntry] = {}
    formats: set[CheckpointFormat] = set()
    files: list[str] = []
    for shard, keys in by_shard.items():
        file = index.parent / shard
        if not file.is_file():
            others = f" and {len(keys) - 1} other keys" if len(keys) > 1 else ""
            raise CheckpointError(
                f"{index}: shard {shard!r} (holding {keys[0]!r}{others}) does not exist in {index.parent}"
            )
        shard_headers = _read_file(file, root)
        absent = [key for key in keys if key not in shard_headers.entries]
        if absent:
            raise CheckpointError(f"{index}: maps {absent[0]!r} to {shard!r}, whose header does not hold it")
        formats.add(shard_headers.format)
        files.append(_relative(file, root))
        entries.update(shard_headers.entries)
    kind: CheckpointFormat = "safetensors" if formats <= {"safetensors"} else "torch.save"
    return CheckpointHeaders(str(index), kind, tuple(files), entries, index=_relative(index, root))


# -- torch.save ------------------------------------------------------------------------------------


def _torch_entries(file: Path, root: Path) -> dict[str, CheckpointEntry]:
    try:
        loaded = torch.load(file, map_location="meta", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if found is None:  # not code: a damaged file, or a pickle torch.save did not write
            reason = re.search(r"Unsupported operand \d+", str(error))
            raise CheckpointError(
                f"{file}: not a readable torch.save file: {reason.group(0) if reason else str(error).strip()}"
            ) from None
        what = found.group(1)
        raise CheckpointError(
            f"{file}: refused: it pickles {what}, not only tensors and plain containers, and check_checkpoint "
            "never runs pickled code (torch.load(weights_only=True) refuses it). If you trust the file, load it "
            "yourself and save its state dict with safetensors.torch.save_file"
        ) from None
    except Exception as error:  # torch.load raises many kinds on a damaged file
        raise CheckpointError(f"{file}: not a readable torch.save file: {type(error).__name__}: {error}") from None
    state = state_dict_in(loaded)
    if state is None:
        raise CheckpointError(
            f"{file}: holds a {type(loaded).__name__}, not a state dict (a mapping of names to tensors, "
            "at its top level or under 'state_dict' or 'model')"
        )
    name = _relative(file, root)
    return {str(key): CheckpointEntry(str(key), *_tensor_metadata(value), name) for key, value in state.items()}


def state_dict_in(loaded: Any) -> Mapping | None:
    """A mapping holding tensors: `loaded` itself, or its "state_dict" or "model" entry (training
    checkpoints)."""
    if not isinstance(loaded, Mapping):
        return None
    if any(isinstance(value, torch.Tensor) for value in loaded.values()):
        return loaded
    for key in ("state_dict", "model"):
        inner = loaded.get(key)
        if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            return inner
    return None


def _tensor_metadata(value: Any) -> tuple[tuple[int, ...] | None, str | None]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), dtype_name(value.dtype)
    return None, None


# -- torch.distributed.checkpoint ------------------------------------------------------------------

# Note: [DCP metadata]
# `FileSystemReader(path).read_metadata()` is `pickle.load` of `.metadata`, which runs whatever code
# the file names. We unpickle it ourselves, allowing only the globals DCP's own metadata pickles
# into (read off `pickletools` of torch 2.13's files): its metadata dataclasses, `torch.Size`, dtypes,
# `torch.serialization._get_layout` (a name lookup), the memory-format enum and pathlib paths
# (`storage_meta.checkpoint_id`). Re-check this list when torch changes `Metadata`. Python 3.13
# pickles a path as `pathlib._local.PosixPath`: read as `pathlib`'s class of that name, so a file
# written under 3.13 also reads under 3.10 to 3.12 (where DCP's own `pickle.load` fails).
_DCP_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _RefusedGlobal(pickle.UnpicklingError):
    """A global outside `_DCP_GLOBALS`: the pickle would call or build something DCP never writes."""


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "pathlib._local":  # Python 3.13's home of the path classes
            module = "pathlib"
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if is_dtype or name in _DCP_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise _RefusedGlobal(f"{module}.{name}")


def _load_dcp_metadata(file: Path) -> Any:
    try:
        with open(file, "rb") as stream:
            metadata = _DcpMetadataUnpickler(stream).load()
        metadata.state_dict_metadata.items()
        return metadata
    except _RefusedGlobal as error:
        raise CheckpointError(
            f"{file}: refused: it pickles {error}, which is not part of DCP's metadata; "
            "check_checkpoint never runs pickled code"
        ) from None
    except Exception as error:  # a damaged pickle raises many kinds
        raise CheckpointError(f"{file}: not readable DCP metadata: {type(error).__name__}: {error}") from None


def _read_dcp(directory: Path) -> CheckpointHeaders:
    metadata_file = directory / DCP_METADATA
    metadata = _load_dcp_metadata(metadata_file)
    first_file: dict[str, str] = {}  # key → the file holding its first chunk
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        first_file.setdefault(index.fqn, info.relative_path)
    for key, relative in first_file.items():
        if not (directory / relative).is_file():
            raise CheckpointError(
                f"{metadata_file}: {key!r} is stored in {relative!r}, which does not exist in {directory}"
            )
    entries = {}
    for key, info in metadata.state_dict_metadata.items():
        tensor = hasattr(info, "size") and hasattr(info, "properties")  # else BytesStorageMetadata
        entries[key] = CheckpointEntry(
            key,
            tuple(info.size) if tensor else None,
            dtype_name(info.properties.dtype) if tensor else None,
            first_file.get(key, DCP_METADATA),
        )
    files = (DCP_METADATA, *sorted(set(first_file.values())))
    return CheckpointHeaders(str(directory), "dcp", files, entries)


def loads_into(stored: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether `load_state_dict` copies a checkpoint tensor of shape `stored` into a tensor of shape
    `target`: equal shapes, and (PyTorch's backward compatibility) a one-element [1] into a scalar."""
    return tuple(stored) == tuple(target) or (len(target) == 0 and tuple(stored) == (1,))
