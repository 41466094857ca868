"""The product as users install it: the wheel and sdist built from the tracked files hold every
module and front-end asset, and the wheel works in a fresh venv that cannot see this source tree.

Built the way `pip install .` and a package index build it (sdist, then a wheel from the sdist), from
a copy of the tracked files, so the editable install of the test run shadows nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import explorer

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tests" / "support" / "installed_smoke.py"
SHIPPED = ("explorer/", "widgets/")

pytestmark = pytest.mark.slow


def tracked_product_files() -> set[str]:
    """The files of explorer/ and widgets/ that git tracks (what a clean clone holds)."""
    listing = subprocess.run(["git", "ls-files", "-z", *SHIPPED], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    return {name for name in listing.split("\0") if name}


@pytest.fixture(scope="module")
def distributions(tmp_path_factory) -> dict[str, Path]:
    """sdist and wheel built with `python -m build` from a copy of every tracked file."""
    source = tmp_path_factory.mktemp("clone")
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True,
                             text=True).stdout
    for name in filter(None, listing.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def test_the_wheel_holds_every_tracked_module_and_front_end_file(distributions):
    with zipfile.ZipFile(distributions["wheel"]) as wheel:
        shipped = {name for name in wheel.namelist() if name.startswith(SHIPPED)}
    assert sorted(tracked_product_files() - shipped) == []
    assert sorted(shipped - tracked_product_files()) == []


def test_the_sdist_holds_every_tracked_module_and_front_end_file(distributions):
    with tarfile.open(distributions["sdist"]) as sdist:
        root = f"deferred_explorer-{explorer.__version__}/"
        names = {member.name.removeprefix(root) for member in sdist.getmembers() if member.isfile()}
    assert sorted(tracked_product_files() - names) == []
    assert {"README.md", "LICENSE", "pyproject.toml"} <= names


def test_the_wheel_metadata_carries_one_version_and_what_an_index_shows(distributions):
    with zipfile.ZipFile(distributions["wheel"]) as wheel:
        metadata_name = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name).decode()
    headers = [line for line in metadata.splitlines() if ": " in line]
    assert f"Version: {explorer.__version__}" in headers
    assert "Requires-Python: >=3.10" in headers
    assert "License-Expression: BSD-3-Clause" in headers
    assert "Requires-Dist: torch<2.16,>=2.11" in headers
    assert "Classifier: Framework :: Jupyter :: JupyterLab" in headers
    assert any(line.startswith("Summary: Build any PyTorch module without storage") for line in headers)


def fresh_venv_with(wheel: Path, where: Path) -> Path:
    """A venv holding only `wheel` (installed by pip, no dependencies); the test run's third-party
    packages are reachable through a .pth line, which does not run that site's own .pth files, so
    the editable install of this tree stays invisible. Returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_test_run_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True)
    return site


def test_the_installed_wheel_builds_inspects_materializes_and_draws_outside_the_source_tree(
        distributions, tmp_path):
    site = fresh_venv_with(distributions["wheel"], tmp_path / "venv")
    smoke = tmp_path / "smoke.py"
    shutil.copy(SMOKE, smoke)
    run = subprocess.run([tmp_path / "venv" / "bin" / "python", "-I", str(smoke), str(site)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "installed product works"
