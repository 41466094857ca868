"""README.md and docs/*.md check themselves: every `python` block runs, every relative link resolves.

Each Markdown file's blocks run in a fresh process, in file order, in one namespace
(`tests/support/doc_blocks.py`); a block that cannot run here says why in its fence
(```` ```python skip: needs a CUDA device ````) and is listed as skipped with that reason. The tests
of the runner itself feed it small broken files.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.doc_blocks import FenceError, broken_links, python_blocks, relative_links, run_blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))  # the reference, one page per topic
DOCS = [README, *PAGES]
DOC_IDS = [str(doc.relative_to(ROOT)) for doc in DOCS]
README_MOST_LINES = 320  # a front page: what it is, how to start, the API at a glance; the reference is in docs/


def _skipped_blocks() -> list:
    """A pytest param per block whose fence says `skip: <reason>` (a malformed fence: none here; the
    fence test reports it)."""
    params = []
    for doc in DOCS:
        try:
            blocks = python_blocks(doc)
        except FenceError:
            continue
        params += [pytest.param(block, id=block.where) for block in blocks if block.skip_reason is not None]
    return params


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_every_python_fence_is_well_formed(doc: Path) -> None:
    python_blocks(doc)  # FenceError names the file, the line and what is wrong


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_python_blocks_run_in_order_in_a_fresh_process(doc: Path, tmp_path: Path) -> None:
    run = run_blocks(doc, workdir=tmp_path)
    if not run.ok:
        pytest.fail(run.report, pytrace=False)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_relative_links_and_images_resolve(doc: Path) -> None:
    problems = broken_links(doc, ROOT)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _linked_pages(doc: Path) -> set[Path]:
    return {resolved.resolve() for _, _, resolved in relative_links(doc, ROOT) if resolved.suffix == ".md"}


def test_the_readme_is_a_front_page_linking_every_reference_page() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    unlinked = sorted(str(page.relative_to(ROOT)) for page in PAGES if page.resolve() not in _linked_pages(README))
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines: move reference material to docs/"
    assert unlinked == [], f"docs pages the README does not link: {unlinked}"
    assert len(PAGES) >= 5, f"the reference has {len(PAGES)} pages in docs/; issue 27 asks for at least five"


@pytest.mark.parametrize("reference", PAGES, ids=DOC_IDS[1:])  # not "page": pytest-playwright's fixture
def test_every_reference_page_links_back_to_the_readme(reference: Path) -> None:
    if README.resolve() not in _linked_pages(reference):
        pytest.fail(f"{reference.relative_to(ROOT)} has no link back to README.md", pytrace=False)


SKIPPED = _skipped_blocks()
if SKIPPED:  # no blocks marked, no test: an empty parameter set would show as a skip of its own

    @pytest.mark.parametrize("block", SKIPPED)
    def test_blocks_that_cannot_run_here_are_listed_with_their_reason(block) -> None:
        pytest.skip(f"{block.where}: {block.skip_reason}")


# The runner on deliberately broken files.


def _markdown(tmp_path: Path, text: str, name: str = "broken.md") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_a_raising_block_fails_the_file_naming_file_line_and_traceback(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """
        # Broken

        ```python
        total = 1
        ```

        ```python
        def halve_nothing():
            return total / 0
        print("before", total)
        halve_nothing()
        ```

        ```python
        print("not reached")
        ```
        """,
    )
    run = run_blocks(doc, workdir=tmp_path)
    assert not run.ok
    assert f"{doc}:3: ok" in run.report and "before 1" in run.report and "not reached" not in run.report
    assert f"{doc}:7: python block raised ZeroDivisionError\nTraceback (most recent call last):\n" in run.report
    assert f'File "{doc}", line 11, in <module>\n    halve_nothing()' in run.report
    assert f'File "{doc}", line 9, in halve_nothing\n    return total / 0' in run.report
    assert run.report.endswith("ZeroDivisionError: division by zero")


def test_blocks_of_a_file_share_one_namespace_and_files_do_not(tmp_path: Path) -> None:
    first = _markdown(
        tmp_path,
        """
        ```python
        import builtins
        builtins.leaked_from_first_file = True
        value = 41
        ```
        Prose between blocks, and a block of another language:
        ```bash
        exit 1
        ```
        ```python
        assert value + 1 == 42, value
        ```
        """,
        name="first.md",
    )
    second = _markdown(
        tmp_path,
        """
        ```python
        import builtins
        assert not hasattr(builtins, "leaked_from_first_file")
        assert "value" not in globals()
        ```
        """,
        name="second.md",
    )
    assert run_blocks(first, workdir=tmp_path).ok
    run = run_blocks(second, workdir=tmp_path)
    assert run.ok and run.report.startswith(f"{second}:1: ok")


def test_a_skipped_block_is_not_run_and_keeps_its_reason(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """
        ```python skip: needs a CUDA device
        raise RuntimeError("ran anyway")
        ```
        """,
    )
    [block] = python_blocks(doc)
    assert (block.line, block.skip_reason, block.code) == (
        1,
        "needs a CUDA device",
        'raise RuntimeError("ran anyway")\n',
    )
    run = run_blocks(doc, workdir=tmp_path)
    assert run.ok and run.report == f"{doc}:1: skipped (needs a CUDA device)"
    with doc.open("a") as more:
        more.write("```python\nprint('after the skipped one')\n```\n")
    run = run_blocks(doc, workdir=tmp_path)
    assert run.ok and run.report.startswith(
        f"{doc}:1: skipped (needs a CUDA device)\nafter the skipped one\n{doc}:4: ok"
    )


def test_a_skip_marker_without_a_reason_is_refused(tmp_path: Path) -> None:
    for fence in ("```python skip", "```python skip:", "```python skip:   "):
        doc = _markdown(tmp_path, f"text\n\n{fence}\nx = 1\n```\n")
        with pytest.raises(FenceError) as error:
            run_blocks(doc, workdir=tmp_path)
        assert str(error.value) == (
            f"{doc}:3: `python skip` needs its reason, as in ```python skip: needs a CUDA device"
        )


def test_an_unknown_fence_option_another_python_name_and_an_unclosed_fence_are_refused(tmp_path: Path) -> None:
    doc = _markdown(tmp_path, "```python skipp: typo\nx = 1\n```\n")
    with pytest.raises(FenceError, match=r"broken.md:1: unknown fence option 'skipp: typo' after `python`"):
        python_blocks(doc)
    doc = _markdown(tmp_path, "```py\nx = 1\n```\n")
    with pytest.raises(FenceError, match=r"broken.md:1: write ```python, not ```py: only `python` blocks run"):
        python_blocks(doc)
    doc = _markdown(tmp_path, "a\n```python\nx = 1\n")
    with pytest.raises(FenceError, match=r"broken.md:2: the fence opened here is never closed"):
        python_blocks(doc)


def test_ipython_magics_run_as_in_a_notebook(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """
        ```python
        %%capture captured
        print("hello")
        ```
        ```python
        assert captured.stdout == "hello\\n", captured.stdout
        ```
        """,
    )
    run = run_blocks(doc, workdir=tmp_path)
    assert run.ok, run.report


def test_a_failing_deferred_cell_fails_its_block(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """
        ```python
        %load_ext widgets
        ```
        ```python
        %%deferred
        model = undefined_config_name
        ```
        """,
    )
    run = run_blocks(doc, workdir=tmp_path)
    assert not run.ok
    assert f"{doc}:4: python block raised NameError" in run.report
    assert run.report.endswith("NameError: name 'undefined_config_name' is not defined")


def test_indented_blocks_run_dedented(tmp_path: Path) -> None:
    doc = _markdown(tmp_path, "- a list item:\n\n  ```python\n  if True:\n      x = 1\n  ```\n")
    [block] = python_blocks(doc)
    assert block.code == "if True:\n    x = 1\n"
    assert run_blocks(doc, workdir=tmp_path).ok


def test_broken_links_and_images_are_named_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "api.md").write_text("# API reference\n\n## Random numbers after construction\n")
    (tmp_path / "shot.png").write_bytes(b"png")
    doc = _markdown(
        tmp_path,
        """
        # Front page

        [fine](docs/api.md), [fine anchor](docs/api.md#random-numbers-after-construction),
        [here](#front-page), ![a picture whose alt text
        spans two lines](shot.png), [web](https://example.com/missing.md), [mail](mailto:a@b.c)

        [gone](docs/gone.md) and ![missing
        picture](img/none.png "title")
        [bad anchor](docs/api.md#no-such-heading) <img src="also/missing.svg">

        `[in code](nowhere.md)`

        ```markdown
        [in a block](nowhere.md)
        ```
        [ref]: missing/reference.md
        """,
    )
    assert broken_links(doc, tmp_path) == [
        f"{doc}:7: link target docs/gone.md does not exist ({tmp_path}/docs/gone.md is missing)",
        f"{doc}:8: link target img/none.png does not exist ({tmp_path}/img/none.png is missing)",
        f"{doc}:9: link docs/api.md#no-such-heading: {tmp_path}/docs/api.md has no heading with the anchor "
        "#no-such-heading",
        f"{doc}:9: link target also/missing.svg does not exist ({tmp_path}/also/missing.svg is missing)",
        f"{doc}:16: link target missing/reference.md does not exist ({tmp_path}/missing/reference.md is missing)",
    ]


def test_blocks_run_as_a_users_file_would_without_the_runners_future_imports(tmp_path: Path) -> None:
    doc = _markdown(
        tmp_path,
        """
        ```python
        def f(x: int) -> None: ...
        assert f.__annotations__ == {"x": int, "return": None}, f.__annotations__
        ```
        """,
    )
    run = run_blocks(doc, workdir=tmp_path)
    assert run.ok, run.report
