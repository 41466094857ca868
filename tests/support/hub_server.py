"""A local stand-in for the Hugging Face Hub: a real HTTP server on 127.0.0.1 serving model repos
from directories, with what `huggingface_hub` calls (`resolve` URLs with HEAD, GET and `Range`, and
the model-info API), a count of the body bytes it sends, and faults a test can inject."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

LLAMA_REPO = "test-org/llama-bf16"  # the repo id the `local_hub` fixture serves its Llama checkpoint as
HANG_S = 3.0
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
# Matched on the path as sent, then unquoted: a revision such as refs/pr/1 comes quoted (refs%2Fpr%2F1).
_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<revision>[^/]+))?")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)")
# Faults taken by any ranged GET, the header probes too; the others only by tensor ranges.
_ANY_RANGE_FAULTS = ("ignore-range", "unknown-size")
_CHUNK = 1 << 20


@dataclass
class Repo:
    directory: Path
    commit: str
    files: dict[str, Path]
    revisions: tuple[str, ...] = ("main",)  # the names that resolve to `commit`


@dataclass
class Fault:
    """What the server does instead of answering a ranged GET of `file` past its header (the next
    `times` such requests): "500", "404", "401", "short" (a body cut short of its Content-Length),
    "reset" (half the body, then a TCP reset), "wrong-range" (a Content-Range of other bytes),
    "etag" (another ETag), "commit" (another X-Repo-Commit), "hang" (no answer for `HANG_S` seconds);
    and for any ranged GET, the header's too: "ignore-range" (200 and the whole file),
    "unknown-size" (a Content-Range of `bytes a-b/*`)."""

    file: str
    kind: str
    times: int = 1


@dataclass
class Served:
    """One request the server answered."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    authorization: str | None


@dataclass
class HubServer:
    """The running server: `endpoint` to point HF_ENDPOINT at, `requests` it answered."""

    endpoint: str = ""
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Served] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)  # the Authorization headers it was sent
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_repo(
        self, repo_id: str, directory: Path, commit: str = "c0ffee" * 6 + "abcd", revisions: tuple[str, ...] = ("main",)
    ) -> None:
        """Serve `directory` as `repo_id` at `commit`, which `revisions` name (again: main moves on)."""
        files = {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}
        self.repos[repo_id] = Repo(directory, commit, files, revisions)

    def bytes_served(self, suffix: str = "") -> int:
        """Body bytes sent so far for files whose path ends with `suffix`."""
        with self.lock:
            return sum(r.body_bytes for r in self.requests if r.path.endswith(suffix))

    def etag(self, path: Path) -> str:
        stat = path.stat()
        return '"' + hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest() + '"'

    def take_fault(self, file: str, tensor_range: bool) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.file == file and fault.times > 0 and (tensor_range or fault.kind in _ANY_RANGE_FAULTS):
                    fault.times -= 1
                    return fault
        return None


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            if self.headers.get("Authorization"):
                with server.lock:
                    server.authorizations.append(self.headers["Authorization"])
            path = self.path.split("?", 1)[0]
            api, resolve = _API.fullmatch(path), _RESOLVE.fullmatch(path)
            if api is not None and unquote(api["repo"]) in server.repos:
                repo = server.repos[unquote(api["repo"])]
                if api["revision"] is not None and unquote(api["revision"]) not in (*repo.revisions, repo.commit):
                    self._send(404, b'{"error": "Revision not found"}', {"X-Error-Code": "RevisionNotFound"}, head)
                    return
                info = {
                    "id": unquote(api["repo"]),
                    "modelId": unquote(api["repo"]),
                    "sha": repo.commit,
                    "private": False,
                    "siblings": [{"rfilename": name} for name in repo.files],
                }
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
            elif resolve is not None and unquote(resolve["repo"]) in server.repos:
                repo = server.repos[unquote(resolve["repo"])]
                self._file(repo, unquote(resolve["revision"]), unquote(resolve["file"]), head)
            else:
                self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)

        def _file(self, repo: Repo, revision: str, name: str, head: bool) -> None:
            if revision not in (*repo.revisions, repo.commit) or name not in repo.files:
                self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
                return
            file = repo.files[name]
            size = file.stat().st_size
            headers = {"X-Repo-Commit": repo.commit, "ETag": server.etag(file), "Accept-Ranges": "bytes"}
            asked = _RANGE.fullmatch(self.headers.get("Range", "") or "")
            if asked is None or head:
                self._send(200, b"" if head else file.read_bytes(), headers, head, length=size)
                return
            begin = int(asked[1])
            end = min(int(asked[2]) + 1 if asked[2] else size, size)
            with open(file, "rb") as stream:
                stream.seek(begin)
                body = stream.read(end - begin)
            fault = server.take_fault(name, tensor_range=begin >= 8 and end - begin > 64)
            content_range = f"bytes {begin}-{end - 1}/{size}"
            if fault is not None and fault.kind == "ignore-range":
                self._send(200, file.read_bytes(), headers, head, length=size)
                return
            if fault is not None and fault.kind == "unknown-size":
                content_range = f"bytes {begin}-{end - 1}/*"
            if fault is not None and fault.kind == "hang":
                time.sleep(HANG_S)
                self.close_connection = True
                return
            if fault is not None and fault.kind in ("500", "404", "401"):
                self._send(int(fault.kind), b"injected fault", {}, head)
                return
            if fault is not None and fault.kind == "wrong-range":
                content_range = f"bytes {begin + 2}-{end + 1}/{size}"
            if fault is not None and fault.kind == "etag":
                headers["ETag"] = '"changed"'
            if fault is not None and fault.kind == "commit":
                headers["X-Repo-Commit"] = "f" * 40
            length = len(body)
            if fault is not None and fault.kind in ("short", "reset"):
                body = body[: len(body) // 2]
            self._send(206, body, {**headers, "Content-Range": content_range}, head, length=length)
            if fault is not None and fault.kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()

        def _send(
            self, status: int, body: bytes, headers: dict[str, str], head: bool, length: int | None = None
        ) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            sent = 0
            if not head:
                try:  # in pieces, counting what the client took before it closed the connection
                    for start in range(0, len(body), _CHUNK):
                        self.wfile.write(body[start : start + _CHUNK])
                        sent += len(body[start : start + _CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                if length is not None and sent < length:
                    self.close_connection = True
            with server.lock:
                server.requests.append(
                    Served(
                        self.command,
                        self.path,
                        self.headers.get("Range"),
                        status,
                        sent,
                        self.headers.get("Authorization"),
                    )
                )

    return Handler


def serve_hub() -> Iterator[HubServer]:
    """Run a HubServer in a thread until the generator is closed (a fixture's body)."""
    state = HubServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
