"""widgets/short_path.js, the browser's port of `explorer.naming.short_path`, passes the shared spec
(tests/support/short_path_cases.json) under node, so the two sides keep one rule."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

TEST = pathlib.Path(__file__).with_name("short_path.test.mjs")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_short_path_js_gives_the_short_names_of_the_shared_spec():
    done = subprocess.run(["node", "--test", str(TEST)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# pass 3" in done.stdout and "# fail 0" in done.stdout
