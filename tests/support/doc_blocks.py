"""The documentation checks itself: its `python` code blocks run, its relative links resolve.

`python_blocks(path)` reads the fenced blocks of a Markdown file whose info string starts with
`python`. A block that cannot run on a CI machine says why in its fence, after the language:

    ```python skip: needs a CUDA device

`run_blocks(path)` runs a file's other blocks in a fresh Python process (this interpreter: the
venv's under `make test`), in file order, in one namespace, so a later block may use what an
earlier one defined; it stops at the first block that raises and reports the file, the block's
line and the traceback, whose line numbers are the Markdown file's own. A file with an IPython
magic (`%load_ext widgets`, `%%deferred`) runs all its blocks in an IPython shell's namespace,
with the magics translated as a notebook would.

`broken_links(path, root)` lists the relative links and image paths whose target does not exist,
or whose `#anchor` names no heading of the Markdown file it points to, each as "file:line: ...".
Links inside code are not links; `http:`, `mailto:` and other URLs with a scheme are not checked.

Run as a script (`python doc_blocks.py FILE`) it is the child process `run_blocks` starts.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SKIP = re.compile(r"^skip\s*(?::\s*(?P<reason>.*?))?\s*$")
_MAGIC = re.compile(r"^\s*[%!]", re.MULTILINE)
_OTHER_PYTHON_NAMES = frozenset({"py", "python3", "py3", "ipython", "ipython3", "pycon"})  # would not run
_START = "doc-block-start "
REPOSITORY = Path(__file__).resolve().parents[2]


class FenceError(ValueError):
    """A `python` fence this runner cannot read: a skip marker without its reason, an unknown option,
    a fence never closed. The message starts with "file:line:"."""


@dataclasses.dataclass(frozen=True)
class DocBlock:
    """One fenced `python` block: where its fence opens (1-based) and its code, dedented to the fence."""

    path: Path
    line: int
    code: str
    skip_reason: str | None = None

    @property
    def where(self) -> str:
        """How messages name the block: "README.md:42"."""
        return f"{_shown(self.path)}:{self.line}"


@dataclasses.dataclass(frozen=True)
class BlocksRun:
    """What running one file's blocks gave: `ok`, and `report` (per block "file:line: ok (s)" lines,
    then, on failure, the failing block and its traceback)."""

    path: Path
    ok: bool
    report: str


def _shown(path: Path) -> str:
    """`path` relative to the repository when it lies in it (how messages name files)."""
    try:
        return str(path.resolve().relative_to(REPOSITORY))
    except ValueError:
        return str(path)


def _fences(path: Path, lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(opening line index, closing line index, indent, info) of every fenced block; FenceError when
    a fence is not closed."""
    found = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((i for i in range(index + 1, len(lines)) if closing.match(lines[i])), None)
        if end is None:
            raise FenceError(f"{_shown(path)}:{index + 1}: the fence opened here is never closed")
        found.append((index, end, opening["indent"], opening["info"].strip()))
        index = end + 1
    return found


def python_blocks(path: Path) -> list[DocBlock]:
    """Every fenced block of `path` whose info string's first word is `python`, in file order.

    After `python` the fence may say `skip: <reason>`; FenceError (naming file and line) for `skip`
    without a reason, for any other word there, and for a block marked `py`, `python3`, `ipython`
    or `pycon`, which would look like Python to a reader yet never run.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for start, end, indent, info in _fences(path, lines):
        language, _, options = info.partition(" ")
        if language in _OTHER_PYTHON_NAMES:
            raise FenceError(
                f"{_shown(path)}:{start + 1}: write ```python, not ```{language}: only `python` blocks run"
            )
        if language != "python":
            continue
        options = options.strip()
        reason = None
        if options:
            skip = _SKIP.match(options)
            if skip is None:
                raise FenceError(
                    f"{_shown(path)}:{start + 1}: unknown fence option {options!r} after `python` "
                    "(the only one is `skip: <reason>`)"
                )
            reason = skip["reason"]
            if not reason:
                raise FenceError(
                    f"{_shown(path)}:{start + 1}: `python skip` needs its reason, as in "
                    "```python skip: needs a CUDA device"
                )
        code = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[start + 1 : end]
        )
        blocks.append(DocBlock(path, start + 1, code + "\n", reason))
    return blocks


def run_blocks(path: Path, *, workdir: Path | None = None, timeout: float = 120.0) -> BlocksRun:
    """Run the runnable blocks of `path` in a fresh process of this interpreter, in `workdir` (a new
    temporary directory when None, so blocks that write files leave nothing behind), with the
    repository's root first on `sys.path`. FenceError as `python_blocks`."""
    path = path.resolve()
    blocks = python_blocks(path)  # a malformed fence fails here, in the caller's process, with its line
    if all(block.skip_reason is not None for block in blocks):  # nothing to run: no process to start
        return BlocksRun(path, True, "\n".join(f"{block.where}: skipped ({block.skip_reason})" for block in blocks))
    with tempfile.TemporaryDirectory(prefix="doc-blocks-") as scratch:
        cwd = workdir or Path(scratch)
        command = [sys.executable, str(Path(__file__).resolve()), str(path)]
        try:
            child = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
            started = [line[len(_START) :] for line in output.splitlines() if line.startswith(_START)]
            last = started[-1] if started else "before its first block"
            return BlocksRun(
                path, False, f"{_shown(path)}: still running after {timeout:.0f} s, in the block at {last}"
            )
    report = "\n".join(line for line in child.stdout.splitlines() if not line.startswith(_START))
    if child.returncode != 0:
        report = "\n".join(part for part in (report, child.stderr.rstrip()) if part)
        if "python block raised" not in child.stderr:
            report += f"\n{_shown(path)}: the block runner exited with status {child.returncode}"
    return BlocksRun(path, child.returncode == 0, report)


def _namespace_for(blocks: list[DocBlock]) -> tuple[dict, Callable[[str], str]]:
    """A plain `__main__` namespace, or an IPython shell's when a block uses a magic; and how a
    block's code becomes Python (unchanged, or the shell's transform, as a notebook cell's is)."""
    if not any(_MAGIC.search(block.code) for block in blocks):
        return {"__name__": "__main__"}, str
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    return shell.user_ns, shell.transform_cell


def _failure(where: str, error: BaseException, drop: int) -> str:
    """The report of a block that raised: "file:line: python block raised E" and the traceback, less its
    first `drop` frames (the runner's)."""
    frames = traceback.extract_tb(error.__traceback__)[drop:]
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(error), error))
    return f"{where}: python block raised {type(error).__name__}\nTraceback (most recent call last):\n{text}"


def _run_in_this_process(path: Path) -> int:
    """The child's work: run the blocks in order; print a line per block; on the first that raises,
    its file, line and traceback on stderr, and return 1.

    `%%deferred` shows a failing cell's error in place instead of raising it, and keeps it as
    `_deferred_error`: a block that leaves a new one there counts as raising it.
    """
    blocks = python_blocks(path)
    namespace, to_python = _namespace_for([block for block in blocks if block.skip_reason is None])
    for block in blocks:
        if block.skip_reason is not None:
            print(f"{block.where}: skipped ({block.skip_reason})", flush=True)
            continue
        print(f"{_START}{block.where}", flush=True)
        shown_error = namespace.get("_deferred_error")
        began = time.perf_counter()
        try:
            # Padded so that tracebacks give the Markdown file's own line numbers; `dont_inherit`:
            # the block is compiled as a user's file would be, without this module's __future__ imports.
            code = compile("\n" * block.line + to_python(block.code), str(path), "exec", dont_inherit=True)
            exec(code, namespace)
        except BaseException as error:  # any failure of a block, KeyboardInterrupt included, is the report
            print(_failure(block.where, error, drop=1), file=sys.stderr, flush=True)
            return 1
        if namespace.get("_deferred_error") is not shown_error:
            print(_failure(block.where, namespace["_deferred_error"], drop=0), file=sys.stderr, flush=True)
            return 1
        print(f"{block.where}: ok ({time.perf_counter() - began:.1f} s)", flush=True)
    return 0


_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*<?(?P<target>[^\s>]+)>?", re.MULTILINE)
_HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"'](?P<target>[^\"']+)[\"']", re.IGNORECASE)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\n[ \t]*\n).)+?\1", re.DOTALL)  # within a paragraph
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_SCHEME = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
_HEADING = re.compile(r"^[ ]{0,3}#{1,6}[ \t]+(?P<text>.*?)[ \t]*#*[ \t]*$")
_EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)


def _blanked(text: str, pattern: re.Pattern[str]) -> str:
    """`text` with every match of `pattern` replaced by spaces (newlines kept, so offsets and line
    numbers stay those of the file)."""
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)


def _prose(path: Path) -> str:
    """The file's text with fenced blocks, code spans and HTML comments blanked out."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for start, end, _, _ in _fences(path, lines):
        for index in range(start, end + 1):
            lines[index] = ""
    return _blanked(_blanked("\n".join(lines), _COMMENT), _CODE_SPAN)


def heading_anchors(path: Path) -> set[str]:
    """The `#anchors` GitHub gives the headings of a Markdown file (lowercased, punctuation dropped,
    spaces to hyphens, "-1", "-2" for repeats), plus explicit `<a name=...>` / `id=...` anchors."""
    anchors: set[str] = set()
    text = _prose(path)
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading["text"].replace("`", "").lower()).replace(" ", "-")
        candidate, repeat = slug, 0
        while candidate in anchors:
            repeat += 1
            candidate = f"{slug}-{repeat}"
        anchors.add(candidate)
    # the raw text: code spans are blanked in `_prose`, yet an explicit anchor is HTML, not code
    anchors.update(_EXPLICIT_ANCHOR.findall(path.read_text(encoding="utf-8")))
    return anchors


def relative_links(path: Path, root: Path) -> list[tuple[int, str, Path]]:
    """(line, target as written, file it resolves to) for every relative link and image path of
    Markdown file `path`, in file order; links with a scheme (`https:`, `mailto:`) and links inside
    code are left out. A target starting with "/" is read from `root` (the repository), as GitHub
    does; a bare `#anchor` resolves to `path` itself."""
    text = _prose(path)
    found = []
    for pattern in (_LINK, _REFERENCE, _HTML):
        for match in pattern.finditer(text):
            target = match["target"]
            if _SCHEME.match(target):
                continue
            location = urllib.parse.unquote(target.partition("#")[0].partition("?")[0])
            if location.startswith("/"):
                resolved = root / location.lstrip("/")
            else:
                resolved = (path.parent / location) if location else path
            found.append((text.count("\n", 0, match.start("target")) + 1, target, resolved))
    return sorted(found, key=lambda link: link[0])


def broken_links(path: Path, root: Path) -> list[str]:
    """A "file:line: ..." message for every relative link or image path of Markdown file `path`
    whose target is missing, or whose `#anchor` no heading of the target Markdown file has."""
    problems = []
    for line, target, resolved in relative_links(path, root):
        anchor = urllib.parse.unquote(target.partition("#")[2])
        if not resolved.exists():
            problems.append(
                f"{_shown(path)}:{line}: link target {target} does not exist ({_shown(resolved.resolve())} is missing)"
            )
        elif anchor and resolved.suffix == ".md" and anchor.lower() not in heading_anchors(resolved):
            problems.append(
                f"{_shown(path)}:{line}: link {target}: {_shown(resolved.resolve())} has no heading "
                f"with the anchor #{anchor}"
            )
    return problems


if __name__ == "__main__":
    sys.path[0] = str(REPOSITORY)  # imports as from the repository root, whatever the working directory
    sys.exit(_run_in_this_process(Path(sys.argv[1])))
