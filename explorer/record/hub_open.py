"""A Hub repo opened under deferred init: its safetensors shards become header stubs, nothing more.

`from_pretrained("org/name")` asks transformers' `cached_files` for the config, the shard index and
the shards. Inside a deferred scope that function is wrapped (and restored on every exit): the
first time a repo is asked for, its revision is pinned to a commit with one model-info call, and
every file of it is then resolved at that commit, so a repo that changes meanwhile cannot mix
revisions. Small files (config, index, generation config) download as usual. A `*.safetensors` file
is not downloaded: two range requests read its header, which is written into a header stub
(hub_fetch.py) whose path is returned. The loader then opens the stub with `safe_open` (wrapped by
checkpoint_reads.py), so each tensor is a recorded read of the stub, and materializing fetches its
bytes (hub_fetch.read_remote). A pickled checkpoint (`.bin`, `.pt`, `.pth`, `.ckpt`) is refused: it
cannot be read lazily, nor safely.

Note: [cached_files is the narrowest seam] `cached_file` and `get_checkpoint_shard_files` both call
the module global `transformers.utils.hub.cached_files`, and only `transformers.exporters.base`, no
weight loader, binds it by name (checked for transformers 5.24; re-check on upgrades), so replacing
that one name covers every weight lookup of `from_pretrained`, while tokenizers and processors
outside deferred scopes are untouched. Releases before `cached_files` (4.45 to about 4.50) look each
file up with `cached_file`, which the hub module and `transformers.modeling_utils` both hold by
name: those two bindings are replaced there (`SingleFileOpener`). Loaders other than transformers'
(diffusers) still download.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ..checkpoint_headers import MAX_HEADER_BYTES
from ..errors import HubCheckpointError, MaterializationError
from ..hub_fetch import (
    RemoteFile,
    cache_root,
    cached_commit,
    endpoint_folder,
    fetch_range,
    register_stub,
    remember_token,
    remote_file,
    write_atomically,
)
from .scope import recording_graph

_PICKLED = (".bin", ".bin.index.json", ".pt", ".pth", ".ckpt")
_PARALLEL_HEADERS = 8


@dataclass(frozen=True, slots=True)
class PinnedRepo:
    """A repo at the commit its revision named when it was first opened in this scope."""

    endpoint: str
    repo_id: str
    repo_type: str
    commit: str
    files: frozenset[str]


def pin_repo(repo_id: str, revision: str | None, repo_type: str | None, token: Any) -> PinnedRepo:
    """The commit `revision` names now, and the files of the repo at it (one model-info call).
    Raises CheckpointError naming the repo when the Hub refuses."""
    try:
        from huggingface_hub import HfApi, constants
    except ImportError:  # an optional dependency: transformers brings it
        raise HubCheckpointError(f"opening {repo_id} needs huggingface_hub: pip install huggingface_hub") from None

    endpoint = constants.ENDPOINT
    try:
        info = HfApi(endpoint=endpoint).repo_info(
            repo_id, revision=revision, repo_type=repo_type, token=token, files_metadata=False
        )
    except Exception as error:  # huggingface_hub's HTTP errors, connection errors
        message = str(error).replace(token, "<token>") if isinstance(token, str) and token else str(error)
        raise HubCheckpointError(
            f"opening {repo_id} (revision {revision or 'main'}) on {endpoint} failed: {message}"
        ) from None
    files = frozenset(sibling.rfilename for sibling in getattr(info, "siblings", None) or ())
    pinned = PinnedRepo(endpoint, repo_id, repo_type or "model", str(info.sha), files)
    pins = _pins_file(endpoint, pinned.repo_type, repo_id, revision)
    write_atomically(pins, json.dumps({"commit": pinned.commit, "files": sorted(files)}).encode())
    return pinned


def pinned_before(repo_id: str, revision: str | None, repo_type: str | None) -> PinnedRepo | None:
    """Offline: the commit and files `revision` of the repo was last pinned to here, or None. None
    too when huggingface_hub's cache resolves `revision` to another commit (a normal download since):
    offline, eager `from_pretrained` loads what that cache names, so the caller defers to it."""
    from huggingface_hub import constants

    pins = _pins_file(constants.ENDPOINT, repo_type or "model", repo_id, revision)
    if not pins.is_file():
        return None
    known = json.loads(pins.read_text())
    if cached_commit(repo_id, revision, repo_type) not in (None, known["commit"]):
        return None
    return PinnedRepo(constants.ENDPOINT, repo_id, repo_type or "model", known["commit"], frozenset(known["files"]))


def _pins_file(endpoint: str, repo_type: str, repo_id: str, revision: str | None) -> Path:
    """Where the commit a revision was pinned to is kept, for opening the repo again offline."""
    name = (revision or "main").replace("/", "%2F")
    return cache_root() / "stubs" / endpoint_folder(endpoint) / repo_type / repo_id / "pins" / f"{name}.json"


def _stub_folder(repo: PinnedRepo) -> Path:
    return cache_root() / "stubs" / endpoint_folder(repo.endpoint) / repo.repo_type / repo.repo_id / repo.commit


def header_stub(repo: PinnedRepo, filename: str) -> str:
    """The path of the header stub of safetensors file `filename` of `repo` (see the module
    docstring), reading its header with two range requests unless a stub is already there.
    Raises CheckpointError naming the file when the header cannot be read."""
    path = str(_stub_folder(repo) / filename)
    if remote_file(path) is not None and os.path.isfile(path):
        return path
    probe = RemoteFile(repo.endpoint, repo.repo_id, repo.repo_type, repo.commit, filename, 0, None)
    try:
        length_field, headers = fetch_range(probe, 0, 8, "the header length")
        total = _file_size(probe, headers)
        length = int.from_bytes(length_field, "little")
        if length > MAX_HEADER_BYTES or 8 + length > total:
            raise HubCheckpointError(
                f"{probe.label()}: safetensors header length {length:,} does not fit its {total:,} bytes"
            )
        header, headers = fetch_range(probe, 8, 8 + length, "the header")
    except (MaterializationError, ValueError) as error:
        raise HubCheckpointError(str(error)) from None
    served = headers.get("X-Repo-Commit")
    if served is not None and served != repo.commit:
        raise HubCheckpointError(f"{probe.label()}: served from commit {served}, not the pinned {repo.commit}")
    _write_stub(Path(path), length_field + header, total)
    register_stub(path, dataclasses.replace(probe, size=total, etag=_etag(headers)))
    return path


def _file_size(probe: RemoteFile, headers: Any) -> int:
    """The file's size, as the `Content-Range` of a range answer gives it (`bytes 0-7/<size>`)."""
    total = headers.get("Content-Range", "").rsplit("/", 1)[-1].strip()
    if not total.isdigit():
        raise HubCheckpointError(
            f"{probe.label()}: the server did not give the file's size (Content-Range "
            f"{headers.get('Content-Range')!r}), which reading its tensors by byte range needs"
        )
    return int(total)


def header_stubs(repo: PinnedRepo, filenames: list[str]) -> list[str | None]:
    """`header_stub` of each of `filenames` that `repo` holds (None for the others), up to
    `_PARALLEL_HEADERS` at once: a repo of 163 shards is 326 round trips."""
    held = [name for name in filenames if name in repo.files]
    with ThreadPoolExecutor(max(1, min(_PARALLEL_HEADERS, len(held)))) as pool:
        stubs = dict(zip(held, pool.map(lambda name: header_stub(repo, name), held)))
    return [stubs.get(name) for name in filenames]


def _etag(headers: Any) -> str | None:
    return headers.get("X-Linked-Etag") or headers.get("ETag")


def _write_stub(path: Path, header: bytes, size: int) -> None:
    """The header, then a hole up to `size` (sparse: no disk used), under its final name at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")  # one per writer
    try:
        with open(temporary, "wb") as stream:
            stream.write(header)
            stream.truncate(size)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class HubOpener:
    """`transformers.utils.hub.cached_files` inside a deferred scope (see the module docstring)."""

    def __init__(self, original: Any) -> None:
        self._original = original
        self._pinned: dict[tuple[str, str, str | None, str | None], PinnedRepo] = {}

    def _pinned_repo(self, repo_id: str, kwargs: dict[str, Any]) -> PinnedRepo | None:
        """The repo pinned at its first request in this scope; offline, as pinned before (or None)."""
        from huggingface_hub import constants

        token, repo_type, revision = kwargs.get("token"), kwargs.get("repo_type"), kwargs.get("revision")
        key = (constants.ENDPOINT, repo_id, revision, repo_type)
        if key not in self._pinned:
            if constants.HF_HUB_OFFLINE or kwargs.get("local_files_only"):
                pinned = pinned_before(repo_id, revision, repo_type)
            else:
                pinned = pin_repo(repo_id, revision, repo_type, token)
            if pinned is None:
                return None
            self._pinned[key] = pinned
            remember_token(constants.ENDPOINT, repo_id, token)
        return self._pinned[key]

    def __call__(self, path_or_repo_id: Any, filenames: list[str], **kwargs: Any) -> list[str] | None:
        repo_id = str(path_or_repo_id)
        if recording_graph() is None or os.path.isdir(repo_id):  # another thread, or a local folder
            return self._original(path_or_repo_id, filenames, **kwargs)
        repo = self._pinned_repo(repo_id, kwargs)
        if repo is None:  # offline, and never opened here: as transformers would (from its cache)
            return self._original(path_or_repo_id, filenames, **kwargs)
        subfolder = kwargs.get("subfolder") or ""
        full = {name: f"{subfolder}/{name}" if subfolder else name for name in filenames}
        refuse_pickles(repo, [full[name] for name in filenames])
        shards = [name for name in filenames if name.endswith(".safetensors")]
        resolved: dict[str, str | None] = dict(zip(shards, header_stubs(repo, [full[name] for name in shards])))
        others = [name for name in filenames if name not in resolved]
        if others:
            found = self._original(path_or_repo_id, others, **{**kwargs, "revision": repo.commit}) or []
            resolved.update(_by_name(others, found, subfolder))
        return _finish(repo_id, filenames, resolved, kwargs)


def refuse_pickles(repo: PinnedRepo, filenames: list[str]) -> None:
    """HubCheckpointError for the first of `filenames` that is a pickled checkpoint `repo` holds."""
    for name in filenames:
        if name.endswith(_PICKLED) and name in repo.files:
            raise HubCheckpointError(
                f"{repo.repo_id}: {name} is a pickled checkpoint, which cannot be opened without downloading "
                "it whole nor loaded without running the code it may pickle; deferred_init reads Hub checkpoints "
                "in safetensors only (convert it, or download it and use explorer.load_checkpoint)"
            )


def _by_name(names: list[str], found: list[str], subfolder: str) -> dict[str, str | None]:
    """Which of `found` (cache paths) is each of `names`."""
    tails = {name: os.sep + os.path.join(subfolder, name) for name in names}
    return {name: next((path for path in found if path.endswith(tail)), None) for name, tail in tails.items()}


def _finish(
    repo_id: str, filenames: list[str], resolved: dict[str, str | None], kwargs: dict[str, Any]
) -> list[str] | None:
    missing = [name for name in filenames if resolved.get(name) is None]
    if missing and kwargs.get("_raise_exceptions_for_missing_entries", True):
        raise OSError(f"{repo_id} does not appear to have a file named {missing[0]}")
    paths = [path for name in filenames if (path := resolved.get(name)) is not None]
    return paths or None


HUB_SCHEME = "hub://"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def hub_checkpoint(path: str | os.PathLike) -> str | os.PathLike:
    """`path` itself, unless it names a Hub repo as `hub://org/name[@revision][/subfolder]`: then a
    local directory holding its shard index and a header stub of each shard (fetched at the pinned
    commit; `HF_ENDPOINT` and `HF_TOKEN` as huggingface_hub reads them), which `read_headers`,
    `load_checkpoint` and `check_checkpoint` read like a local checkpoint. Raises
    HubCheckpointError naming the repo when it holds no safetensors checkpoint there."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text.startswith(HUB_SCHEME):
        return path
    repo_id, revision, subfolder = hub_url_parts(text)
    repo = pin_repo(repo_id, revision, None, None)
    prefix = f"{subfolder}/" if subfolder else ""
    if prefix + _SINGLE in repo.files:  # before the index, as from_pretrained and a local folder choose
        return os.path.dirname(header_stub(repo, prefix + _SINGLE))
    if prefix + _INDEX in repo.files:
        index = _download_json(repo, prefix + _INDEX)
        shards = sorted(set(json.loads(Path(index).read_text(encoding="utf-8")).get("weight_map", {}).values()))
        header_stubs(repo, [prefix + shard for shard in shards])
        return os.path.dirname(index)
    pickled = sorted(f for f in repo.files if f.startswith(prefix) and f.endswith(_PICKLED))
    why = f"only the pickled {pickled[0]}, which cannot be read lazily nor safely" if pickled else "no such file"
    raise HubCheckpointError(f"{text}: no {prefix}{_INDEX} or {prefix}{_SINGLE} at commit {repo.commit}: {why}")


def hub_url_parts(url: str) -> tuple[str, str | None, str]:
    """(repo id, revision or None, subfolder) of `hub://org/name[@revision][/subfolder]`. A revision
    holding "/" is written with `%2F`, or as itself when it is a Hub ref (`@refs/pr/1`,
    `@refs/convert/parquet`), which always has three parts."""
    org, _, rest = url[len(HUB_SCHEME) :].partition("/")
    name, _, subfolder = rest.partition("/")
    name, _, revision = name.partition("@")
    if revision == "refs":
        parts = subfolder.split("/", 2)
        revision, subfolder = "/".join(["refs", *parts[:2]]), (parts[2] if len(parts) > 2 else "")
    return f"{org}/{name}", unquote(revision) or None, subfolder.strip("/")


def _download_json(repo: PinnedRepo, filename: str) -> str:
    """A small file of `repo`, downloaded at its commit and copied beside its shards' stubs."""
    from huggingface_hub import hf_hub_download

    try:
        cached = hf_hub_download(
            repo.repo_id, filename, repo_type=repo.repo_type, revision=repo.commit, endpoint=repo.endpoint
        )
    except Exception as error:  # huggingface_hub's HTTP errors, connection errors
        raise HubCheckpointError(f"{repo.repo_id}@{repo.commit[:12]}/{filename}: download failed: {error}") from None
    path = _stub_folder(repo) / filename
    write_atomically(path, Path(cached).read_bytes())
    return str(path)


_HUB_HOME = "transformers.utils.hub"
# Where transformers releases before `cached_files` (4.45 to about 4.50) look weights up with
# `cached_file`: the hub module itself (`get_checkpoint_shard_files`) and the loader, which binds
# the name at import (note [cached_files is the narrowest seam]).
_SINGLE_FILE_HOMES = (_HUB_HOME, "transformers.modeling_utils")


class SingleFileOpener:
    """`cached_file(path_or_repo_id, filename, **kwargs)` of transformers releases without
    `cached_files`, answered by a `HubOpener` over the original, one file at a time."""

    def __init__(self, original: Any) -> None:
        def each(path_or_repo_id: Any, filenames: list[str], **kwargs: Any) -> list[str] | None:
            found = [original(path_or_repo_id, name, **kwargs) for name in filenames]
            return [path for path in found if path is not None] or None

        self._opener = HubOpener(each)

    def __call__(self, path_or_repo_id: Any, filename: str, **kwargs: Any) -> str | None:
        found = self._opener(path_or_repo_id, [filename], **kwargs)
        return found[0] if found else None


@contextlib.contextmanager
def recorded_hub_downloads() -> Iterator[None]:
    """Inside the block, Hub safetensors shards asked for by transformers are header stubs (see the
    module docstring); undone on any exit."""
    module: Any = sys.modules.get(_HUB_HOME)
    original = getattr(module, "cached_files", None)
    if original is None:
        with _recorded_single_file_lookups(module):
            yield
        return
    if isinstance(original, HubOpener):
        yield
        return
    module.cached_files = HubOpener(original)
    try:
        yield
    finally:
        module.cached_files = original


@contextlib.contextmanager
def _recorded_single_file_lookups(hub: Any) -> Iterator[None]:
    """`recorded_hub_downloads` for transformers releases that look each file up with `cached_file`."""
    original = getattr(hub, "cached_file", None)
    if original is None or isinstance(original, SingleFileOpener):
        yield
        return
    opener = SingleFileOpener(original)
    homes = [
        home for name in _SINGLE_FILE_HOMES if getattr(home := sys.modules.get(name), "cached_file", None) is original
    ]
    for home in homes:
        home.cached_file = opener  # type: ignore[union-attr]  # the homes hold the name (checked above)
    try:
        yield
    finally:
        for home in homes:
            home.cached_file = original  # type: ignore[union-attr]  # restoring what the homes held
