"""The wheel ships the fixtures: built with ``pip wheel``, installed into a
fresh virtual environment (``--no-deps``; the dependencies already installed
here are made visible to it), ``torchgradlint harness`` runs the bundled
fixtures from any folder, and ``--fixtures DIR`` runs a user's own."""

import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT

pytestmark = pytest.mark.slow


def _sh(*cmd, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(python, torchgradlint script, site-packages)`` of a venv holding only the built wheel."""
    base = tmp_path_factory.mktemp("wheel")
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    tree = base / "tree"  # the files a build needs, copied: the build leaves nothing in the checkout
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    for name in ("src", "fixtures"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _sh(sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", *isolation, "-w", base / "dist", cwd=tree)
    (wheel,) = (base / "dist").glob("torchgradlint-*.whl")
    venv = base / "venv"
    _sh(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _sh(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    site = Path(_sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # the dependencies (torch, libcst, ...) from this environment, after the venv's own site-packages
    (site / "_deps_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, venv / "bin" / "torchgradlint", site


def test_the_wheel_holds_every_fixture(installed):
    _, _, site = installed
    shipped = sorted(p.relative_to(site / "torchgradlint" / "fixtures") for p in
                     (site / "torchgradlint" / "fixtures").glob("TGL*/*.py"))
    assert shipped == sorted(p.relative_to(FIXTURES) for p in FIXTURES.glob("TGL*/*.py"))
    _sh(installed[0], "-c", f"import torchgradlint; assert torchgradlint.__file__.startswith({str(site)!r})")


def test_harness_runs_the_shipped_fixtures_from_any_folder(installed, tmp_path):
    python, script, site = installed
    out = subprocess.run([script, "harness", "--rule", "TGL001", "--device", "cpu", "--steps", "4", "--format", "json",
                          "-q"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Warning" not in out.stderr, out.stderr  # e.g. NumPy's "Failed to initialize NumPy"
    report = json.loads(out.stdout)
    names = sorted(r["fixture"] for r in report["results"])
    assert names == sorted(f"TGL001/{p.stem}" for p in FIXTURES.glob("TGL001/*.py"))
    assert all(Path(r["path"]).resolve().is_relative_to(site.resolve()) for r in report["results"])
    assert report["agree"] is True


def test_harness_runs_a_users_own_folder(installed, tmp_path):
    _, script, _ = installed
    mine = tmp_path / "my_programs" / "TGL001"
    mine.mkdir(parents=True)
    shutil.copy(FIXTURES / "TGL001" / "bad_basic_loop.py", mine / "bad_mine.py")
    out = subprocess.run([script, "harness", "--fixtures", tmp_path / "my_programs", "--device", "cpu", "--steps", "4",
                          "--format", "json", "-q"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert Path(result["path"]).name == "bad_mine.py" and result["verdict"] == "agree" and result["defect"]
