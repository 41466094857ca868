"""Byte ranges of safetensors files on the Hugging Face Hub, fetched on demand and cached on disk.

A Hub shard opened under deferred init (record/hub_open.py) is stood in for by a *header stub*: a
local file holding the shard's 8-byte length and JSON header, then a hole up to the shard's size
(a sparse file: its apparent size is the shard's, its disk use the header's). Every header reader
(`safe_open`, `checkpoint_headers`) then works on the stub unchanged, and recorded reads keep the
stub's path, so neither the graph nor an export holds a URL's token. Each stub is registered here
with its `RemoteFile` (also written beside it as `<stub>.remote.json`, so a later process finds it);
reading a tensor of a stub (`read_remote`) fetches exactly that tensor's bytes.

Note: [Hub range cache] A fetched range is written to `<cache>/ranges/<endpoint>/<repo>/<commit>/
<file>/<begin>-<end>` (first byte, last byte; atomically: a temporary name, then `os.replace`), so
materializing again after `release_module`, or with `HF_HUB_OFFLINE=1`, transfers nothing. A commit
never changes, so the cache never goes stale; a file served with another ETag than its header was
is refused instead.

Note: [Hub fetch progress] `prefetch` tells the `FetchReport` installed by `reporting_fetches` (a
context variable of the thread that materializes) the bytes fetched so far after each request, on
that thread. The report may raise to cancel: requests not yet started are dropped and the error
passes on (the ones in flight finish into the cache), so a cancel takes effect between ranges.
`bytes_to_fetch` says beforehand how many bytes which host will send, counting cached ones apart.

Note: [Hub resumed bodies] Every tensor range is fetched by `stream_range`: a body cut short (a
dropped connection, a timeout between bytes) is asked again for the bytes still missing only, with
a `Range` from the first byte not received, up to `RETRY.attempts` requests; the ETag and commit
checks hold each request to the same file. Header reads (`fetch_range`) are small and retried whole.

Limitations: one request per tensor range (`prefetch` coalesces a layer's contiguous ranges into
one request per run).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from .checkpoint_headers import safetensors_spans
from .errors import MaterializationError

_REMOTE_SUFFIX = ".remote.json"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_PARALLEL = 4  # connections `prefetch` keeps open at once
_MAX_RUN_BYTES = 64 << 20  # a coalesced request is held in memory whole: tensors past this go alone


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """Where a header stub's data lives: one file of one repo at one commit. Holds no token (tokens
    stay in this process, see `remember_token`), so it may be written to disk and shown."""

    endpoint: str
    repo_id: str
    repo_type: str
    commit: str
    filename: str  # the path in the repo, subfolder included
    size: int  # the whole file's, in bytes
    etag: str | None

    def label(self) -> str:
        """`org/name@commit12/file`, how errors name it."""
        return f"{self.repo_id}@{self.commit[:12]}/{self.filename}"

    @property
    def host(self) -> str:
        """The endpoint's `host[:port]`, e.g. "huggingface.co", as previews and progress name it."""
        return urlsplit(self.endpoint).netloc or self.endpoint


@dataclass(frozen=True, slots=True)
class HubBytes:
    """Bytes a set of reads takes from one host: `fetch` still to transfer, `cached` in the range cache."""

    fetch: int = 0
    cached: int = 0


@dataclass(frozen=True, slots=True)
class FetchProgress:
    """A prefetch's transfer so far (note [Hub fetch progress]): `done_bytes` of `total_bytes` from
    `hosts` ("a, b" when several), in `seconds` since its first request."""

    hosts: str
    done_bytes: int
    total_bytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.done_bytes / self.seconds if self.seconds > 0 else 0.0


FetchReport = Callable[[FetchProgress], None]
_REPORT: contextvars.ContextVar[FetchReport | None] = contextvars.ContextVar("hub_fetch_report", default=None)


@contextlib.contextmanager
def reporting_fetches(report: FetchReport) -> Iterator[None]:
    """Inside the block, this thread's prefetches call `report` after each request; it may raise to
    cancel (note [Hub fetch progress])."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and how patiently, a range request is retried on 5xx, 429 and connection errors."""

    attempts: int = 5
    first_wait_s: float = 0.5
    max_wait_s: float = 8.0
    timeout_s: float = 60.0  # per request, connect and between bytes


RETRY = RetryPolicy()
_STUBS: dict[str, RemoteFile] = {}
_TOKENS: dict[tuple[str, str], str | bool] = {}  # (endpoint, repo_id) → the token= a loader was given


def cache_root() -> Path:
    """Where stubs and fetched ranges are kept: `$EXPLORER_HUB_CACHE`, else `<HF_HOME>/deferred-explorer`."""
    from huggingface_hub import constants

    return Path(os.environ.get("EXPLORER_HUB_CACHE") or os.path.join(constants.HF_HOME, "deferred-explorer"))


# Note: [huggingface_hub's own cache] A normal download (`from_pretrained` outside deferred init,
# `hf_hub_download`) keeps whole files under `HF_HUB_CACHE/<repo folder>/snapshots/<commit>/` and
# what each branch pointed at under `refs/<revision>`. Offline, eager `from_pretrained` resolves a
# revision through those refs, so a pin of ours naming another commit yields to them
# (`hub_open.pinned_before`); and the bytes of a file downloaded whole at the pinned commit are read
# from that copy, not fetched again (`downloaded_copy`). huggingface_hub documents this layout
# ("Manage the cache"); `try_to_load_from_cache` and `repo_folder_name` are its public readers.


def cached_commit(repo_id: str, revision: str | None, repo_type: str | None) -> str | None:
    """The commit huggingface_hub's cache says `revision` of the repo pointed at when it last
    downloaded from it, or None (note [huggingface_hub's own cache])."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type or "model")
    ref = folder / "refs" / (revision or "main")
    try:
        return ref.read_text().strip() or None if ref.is_file() else None
    except OSError:
        return None


def downloaded_copy(remote: RemoteFile) -> Path | None:
    """The whole of `remote` as huggingface_hub downloaded it at its commit, of the size its header
    stub was made for, or None (note [huggingface_hub's own cache])."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(remote.repo_id, remote.filename, revision=remote.commit, repo_type=remote.repo_type)
    if not isinstance(found, str) or not os.path.isfile(found):
        return None
    if remote.size is not None and os.path.getsize(found) != remote.size:
        return None
    return Path(found)


def endpoint_folder(endpoint: str) -> str:
    """A folder name for an endpoint: its host, port and path, and a short hash telling apart two on
    one host. Never the URL's user, password or query (`https://user:hf_...@mirror`): the folder
    names stub paths, which recordings, diagrams and `to_fx` code show."""
    parts = urlsplit(endpoint)
    visible = f"{parts.hostname or ''}{f'_{parts.port}' if parts.port else ''}{parts.path}"
    host = re.sub(r"[^A-Za-z0-9.-]+", "_", visible).strip("_")
    return f"{host}-{hashlib.sha256(endpoint.encode()).hexdigest()[:8]}"


def remember_token(endpoint: str, repo_id: str, token: str | bool | None) -> None:
    """Keep the `token=` a loader was given for this repo, in memory only, for its later reads."""
    if token is not None:
        _TOKENS[(endpoint, repo_id)] = token


def register_stub(path: str, remote: RemoteFile) -> None:
    """Record that header stub `path` stands for `remote` (in memory and in `<path>.remote.json`)."""
    sidecar = path + _REMOTE_SUFFIX
    if not os.path.exists(sidecar):
        write_atomically(Path(sidecar), json.dumps(asdict(remote)).encode())
    _STUBS[path] = remote


def remote_file(path: str) -> RemoteFile | None:
    """The Hub file header stub `path` stands for; None for an ordinary local file."""
    found = _STUBS.get(path)
    if found is None and os.path.exists(path + _REMOTE_SUFFIX):
        found = _STUBS[path] = RemoteFile(**json.loads(Path(path + _REMOTE_SUFFIX).read_text()))
    return found


def write_atomically(path: Path, data: bytes | bytearray) -> None:
    """Write `data` to `path` so that no partial file is ever under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{id(data):x}.partial")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


# -- fetching --------------------------------------------------------------------------------------


def fetch_range(remote: RemoteFile, begin: int, end: int, what: str) -> tuple[bytes, Any]:
    """Bytes [begin, end) of `remote`, from one `Range` request (retried per `RETRY`), and the
    response's headers. Raises MaterializationError naming the file and `what` (a tensor's key) on
    an HTTP error, a status other than 206, a Content-Range or length other than asked for, or an
    ETag other than the header's. The token is never part of a message."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    def failed(why: str) -> MaterializationError:
        token = _TOKENS.get((remote.endpoint, remote.repo_id))
        if isinstance(token, str) and token:
            why = why.replace(token, "<token>")
        return MaterializationError(f"fetching {what} (bytes {begin:,}-{end - 1:,}) of {remote.label()} failed: {why}")

    if constants.HF_HUB_OFFLINE:
        raise failed("HF_HUB_OFFLINE is set and these bytes are not in the range cache (see docs/hub.md)")
    url = hf_hub_url(
        remote.repo_id, remote.filename, repo_type=remote.repo_type, revision=remote.commit, endpoint=remote.endpoint
    )
    token = _TOKENS.get((remote.endpoint, remote.repo_id))
    headers = build_hf_headers(token=token, headers={"Range": f"bytes={begin}-{end - 1}"})
    try:
        with _stream_with_retries(url, headers) as response:
            fault = _response_fault(response, remote, begin, end)  # before any of the body
            if fault is not None:
                raise failed(fault)
            body = bytearray()
            for piece in _body_pieces(response):
                body += piece
                if len(body) > end - begin:
                    raise failed(f"the body holds more than the {end - begin:,} bytes asked for")
            answered = response.headers
    except MaterializationError:
        raise
    except Exception as error:  # httpx's and huggingface_hub's errors, after the retries
        raise failed(f"{type(error).__name__}: {error}") from None
    if len(body) != end - begin:
        raise failed(f"the body holds {len(body):,} bytes, not {end - begin:,}")
    return bytes(body), answered


def stream_range(remote: RemoteFile, begin: int, end: int, what: str, chunk_bytes: int) -> Iterator[bytearray]:
    """Bytes [begin, end) of `remote` in pieces of `chunk_bytes` (the last one shorter; each a new
    bytearray the caller may keep or write into), from one
    streamed `Range` request, never holding more than a piece and what the connection buffers. Not
    cached (note [Hub range cache]): `save_checkpoint` copies a model through it. A body cut short
    (a dropped connection, a timeout between bytes) is resumed from the bytes received with a
    `Range` request for the rest, up to `RETRY.attempts` requests in all; errors as `fetch_range`'s."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    failed = functools.partial(_failure, remote, begin, end, what)
    if constants.HF_HUB_OFFLINE:
        raise failed("HF_HUB_OFFLINE is set and these bytes are not in the range cache (see docs/hub.md)")
    url = hf_hub_url(
        remote.repo_id, remote.filename, repo_type=remote.repo_type, revision=remote.commit, endpoint=remote.endpoint
    )
    token = _TOKENS.get((remote.endpoint, remote.repo_id))
    position, requests = begin, 0
    buffer, filled = bytearray(min(chunk_bytes, end - begin)), 0
    while position < end:
        requests += 1
        headers = build_hf_headers(token=token, headers={"Range": f"bytes={position}-{end - 1}"})
        cut: Exception | None = None
        try:
            with _stream_with_retries(url, headers) as response:
                fault = _response_fault(response, remote, position, end)
                if fault is not None:
                    raise failed(fault)
                try:
                    for piece in _body_pieces(response):
                        if position + len(piece) > end:
                            raise failed(f"the body holds more than the {end - begin:,} bytes asked for")
                        position += len(piece)
                        taken = 0
                        while taken < len(piece):
                            count = min(len(piece) - taken, len(buffer) - filled)
                            buffer[filled : filled + count] = piece[taken : taken + count]
                            filled, taken = filled + count, taken + count
                            if filled == len(buffer):
                                yield buffer
                                buffer, filled = bytearray(min(chunk_bytes, end - position + len(piece) - taken)), 0
                except MaterializationError:
                    raise
                except Exception as error:  # the transport's errors: resumed below
                    cut = error
        except MaterializationError:
            raise
        except Exception as error:  # httpx's and huggingface_hub's errors, after their retries
            raise failed(f"{type(error).__name__}: {error}") from None
        if position < end:
            if requests >= RETRY.attempts:
                why = f"{type(cut).__name__}: {cut}" if cut is not None else "the body ended early"
                raise failed(f"{why} ({position - begin:,} of {end - begin:,} bytes received in {requests} requests)")
            time.sleep(min(RETRY.first_wait_s * 2 ** (requests - 1), RETRY.max_wait_s))
    if filled:
        yield buffer


def _failure(remote: RemoteFile, begin: int, end: int, what: str, why: str) -> MaterializationError:
    token = _TOKENS.get((remote.endpoint, remote.repo_id))
    if isinstance(token, str) and token:
        why = why.replace(token, "<token>")
    return MaterializationError(f"fetching {what} (bytes {begin:,}-{end - 1:,}) of {remote.label()} failed: {why}")


# Note: [Two HTTP stacks]
# huggingface_hub 1.0 and later send requests with httpx (`follow_redirects=`, `reason_phrase`,
# `iter_bytes`, `http_stream_backoff`); 0.x, which transformers 4 requires, with requests
# (`allow_redirects=`, `reason`, `iter_content`, `http_backoff(stream=True)`). Both are spoken here,
# chosen by whether `http_stream_backoff` exists; everything else about a response (status, headers,
# content) is named alike.
@functools.cache
def _httpx_stack() -> bool:
    import huggingface_hub.utils

    return hasattr(huggingface_hub.utils, "http_stream_backoff")


def _retried_get(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """huggingface_hub's backoff arguments for a GET of `url` under `RETRY` (both request kinds)."""
    return {
        "method": "GET",
        "url": url,
        "headers": headers,
        "max_retries": RETRY.attempts - 1,
        "base_wait_time": RETRY.first_wait_s,
        "max_wait_time": RETRY.max_wait_s,
        "timeout": RETRY.timeout_s,
        ("follow_redirects" if _httpx_stack() else "allow_redirects"): True,
    }


def _stream_with_retries(url: str, headers: dict[str, str]) -> contextlib.AbstractContextManager[Any]:
    from huggingface_hub.utils import http_backoff

    if not _httpx_stack():
        return contextlib.closing(http_backoff(**_retried_get(url, headers), stream=True))
    from huggingface_hub.utils import http_stream_backoff

    return http_stream_backoff(**_retried_get(url, headers))


def _body_pieces(response: Any) -> Iterator[bytes]:
    """A streamed response's body as it arrives (note [Two HTTP stacks])."""
    if hasattr(response, "iter_bytes"):
        return response.iter_bytes()
    return response.iter_content(chunk_size=1 << 16)


def _reason(response: Any) -> str:
    """The status line's text, as 'Unauthorized' (note [Two HTTP stacks])."""
    return getattr(response, "reason_phrase", None) or getattr(response, "reason", None) or ""


def _response_fault(response: Any, remote: RemoteFile, begin: int, end: int) -> str | None:
    """What is wrong with `response` (streamed: its body is checked as it comes) to a request for
    bytes [begin, end) of `remote`, or None."""
    if response.status_code in (401, 403):
        return (
            f"HTTP {response.status_code} ({_reason(response)}): the repo is gated or private, or the token "
            "lacks access: pass token= to the loader, or set HF_TOKEN"
        )
    if response.status_code != 206:
        reason = "the server ignored the Range header" if response.status_code == 200 else _reason(response)
        return f"HTTP {response.status_code} ({reason}); expected 206 Partial Content"
    sent = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    if sent is None or (int(sent[1]), int(sent[2]) + 1) != (begin, end):
        return f"the server sent Content-Range {response.headers.get('Content-Range')!r}"
    commit = response.headers.get("X-Repo-Commit")
    if commit is not None and commit != remote.commit:
        return f"the file changed upstream: served from commit {commit}, not the pinned {remote.commit}"
    etag = response.headers.get("X-Linked-Etag") or response.headers.get("ETag")
    if remote.etag is not None and etag is not None and etag != remote.etag:
        return f"the file changed upstream: ETag {etag} now, {remote.etag} when its header was read"
    return None


# -- the range cache -------------------------------------------------------------------------------


def _cached_range_path(remote: RemoteFile, begin: int, end: int) -> Path:
    folder = cache_root() / "ranges" / endpoint_folder(remote.endpoint) / remote.repo_type / remote.repo_id
    return folder / remote.commit / remote.filename / f"{begin}-{end - 1}"


def is_cached(remote: RemoteFile, begin: int, end: int) -> bool:
    """Whether bytes [begin, end) of `remote` are on disk: in the range cache (note [Hub range
    cache]) or in a whole copy huggingface_hub downloaded (note [huggingface_hub's own cache])."""
    return _cached_range_path(remote, begin, end).is_file() or downloaded_copy(remote) is not None


def cached_range(remote: RemoteFile, begin: int, end: int, what: str) -> bytes | bytearray:
    """Bytes [begin, end) of `remote`: from the range cache (note [Hub range cache]) or a whole
    downloaded copy (note [huggingface_hub's own cache]), else fetched and cached. Raises
    MaterializationError as `fetch_range` does."""
    path = _cached_range_path(remote, begin, end)
    if path.is_file():
        cached = path.read_bytes()
        if len(cached) == end - begin:
            return cached
    copy = downloaded_copy(remote)
    if copy is not None:
        with open(copy, "rb") as stream:
            stream.seek(begin)
            return bytearray(stream.read(end - begin))
    data = fetch_whole(remote, begin, end, what)
    write_atomically(path, data)
    return data


def fetch_whole(remote: RemoteFile, begin: int, end: int, what: str) -> bytes | bytearray:
    """Bytes [begin, end) of `remote` in one piece: `stream_range`'s, so a body cut short resumes
    from the bytes received."""
    pieces = list(stream_range(remote, begin, end, what, max(1, end - begin)))
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


@functools.lru_cache(maxsize=256)
def _spans(path: str, size: int) -> dict[str, tuple[int, int]]:
    return safetensors_spans(path)


def tensor_span(path: str, key: str, shape: list[int], dtype: torch.dtype) -> tuple[int, int]:
    """Where tensor `key` of header stub `path` lies in its file, [begin, end) in bytes, checked
    against the recorded shape and dtype; MaterializationError naming both otherwise."""
    span = _spans(path, os.path.getsize(path)).get(key)
    if span is None:
        raise MaterializationError(f"checkpoint {path} no longer holds {key!r} (it did when recorded)")
    numel = 1
    for size in shape:
        numel *= size
    if span[1] - span[0] != numel * dtype.itemsize:
        raise MaterializationError(
            f"checkpoint {path} holds {key!r} in {span[1] - span[0]:,} bytes, but it was recorded as {dtype} "
            f"{list(shape)} ({numel * dtype.itemsize:,} bytes): record again (deferred_init) to use it"
        )
    return span


def hub_range(path: str, key: str) -> tuple[RemoteFile, int, int] | None:
    """Where tensor `key` of header stub `path` lies on the Hub: (file, begin, end); None for a
    local file, or a key its header does not hold."""
    remote = remote_file(path)
    if remote is None:
        return None
    span = _spans(path, os.path.getsize(path)).get(key)
    return None if span is None else (remote, span[0], span[1])


def bytes_to_fetch(reads: Iterable[tuple[str, str]]) -> dict[str, HubBytes]:
    """Per host, the bytes materializing `reads` (path, key) takes from the Hub, each distinct
    range once: still to fetch, and already cached (0 to transfer). Local files count nowhere."""
    ranges: dict[tuple[RemoteFile, int, int], bool] = {}
    for path, key in reads:
        where = hub_range(path, key)
        if where is not None and where not in ranges:
            ranges[where] = is_cached(*where)
    out: dict[str, HubBytes] = {}
    for (remote, begin, end), cached in ranges.items():
        held = out.get(remote.host, HubBytes())
        size = end - begin
        out[remote.host] = HubBytes(held.fetch + size * (not cached), held.cached + size * cached)
    return out


def read_remote(path: str, remote: RemoteFile, key: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Tensor `key` of the Hub file header stub `path` stands for, fetching only its bytes (or none,
    when cached). Raises MaterializationError naming the file and the key."""
    begin, end = tensor_span(path, key, shape, dtype)
    return tensor_of(cached_range(remote, begin, end, repr(key)), shape, dtype)


def read_remote_rows(
    path: str, remote: RemoteFile, key: str, shape: list[int], dtype: torch.dtype, start: int, stop: int
) -> torch.Tensor:
    """Rows [start, stop) along dim 0 of tensor `key` of stub `path`, fetching only their bytes."""
    begin, _ = tensor_span(path, key, shape, dtype)
    row = dtype.itemsize
    for size in shape[1:]:
        row *= size
    data = cached_range(remote, begin + start * row, begin + stop * row, f"{key!r} rows {start}:{stop}")
    return tensor_of(data, [stop - start, *shape[1:]], dtype)


def tensor_of(data: bytes | bytearray, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` and `dtype` over little-endian bytes `data`: a bytearray is taken over
    (the caller keeps no other use of it), bytes are copied."""
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data if isinstance(data, bytearray) else bytearray(data), dtype=dtype).reshape(shape)


def prefetch(reads: Iterable[tuple[str, str, list[int], torch.dtype]]) -> None:
    """Fill the range cache for the Hub-backed reads among `reads` (path, key, shape, dtype): the
    tensors contiguous in one file are fetched in one request, up to `_PARALLEL` requests at once.
    Local files are skipped. Raises MaterializationError as `fetch_range` does."""
    runs: dict[str, list[tuple[int, int, str]]] = {}
    remotes: dict[str, RemoteFile] = {}
    for path, key, shape, dtype in reads:
        remote = remote_file(path)
        if remote is None:
            continue
        begin, end = tensor_span(path, key, shape, dtype)
        if not is_cached(remote, begin, end):
            remotes[path] = remote
            runs.setdefault(path, []).append((begin, end, key))
    batches = [(remotes[path], run) for path, spans in runs.items() for run in _contiguous_runs(spans)]
    if batches:
        _fetch_batches(batches, _REPORT.get())


def _fetch_batches(batches: list[tuple[RemoteFile, list[tuple[int, int, str]]]], report: FetchReport | None) -> None:
    """Fetch each batch into the cache, `_PARALLEL` at a time, telling `report` after each; a batch
    starts only once the report before it returned, so a report that raises leaves the rest unasked."""
    hosts = ", ".join(dict.fromkeys(remote.host for remote, _ in batches))
    total, done, started = sum(run[-1][1] - run[0][0] for _, run in batches), 0, time.perf_counter()
    waiting = iter(batches)
    with ThreadPoolExecutor(min(_PARALLEL, len(batches))) as pool:
        running = {pool.submit(_fetch_run, *batch) for batch in itertools.islice(waiting, _PARALLEL)}
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                done += future.result()
                if report is not None:
                    report(FetchProgress(hosts, done, total, time.perf_counter() - started))
            running |= {pool.submit(_fetch_run, *batch) for batch in itertools.islice(waiting, len(finished))}


def _contiguous_runs(spans: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    runs: list[list[tuple[int, int, str]]] = []
    for span in sorted(set(spans)):
        if runs and runs[-1][-1][1] == span[0] and span[1] - runs[-1][0][0] <= _MAX_RUN_BYTES:
            runs[-1].append(span)
        else:
            runs.append([span])
    return runs


def _fetch_run(remote: RemoteFile, run: list[tuple[int, int, str]]) -> int:
    begin, end = run[0][0], run[-1][1]
    keys = ", ".join(repr(key) for _, _, key in run[:3]) + (f" and {len(run) - 3} more" if len(run) > 3 else "")
    data = fetch_whole(remote, begin, end, keys)
    for first, last, _ in run:
        write_atomically(_cached_range_path(remote, first, last), data[first - begin : last - begin])
    return len(data)
