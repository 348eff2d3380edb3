"""Runs pre-commit itself: the hook fails on a bad file and passes once it is fixed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snippets import MISSING_ZERO_GRAD

ROOT = Path(__file__).resolve().parent.parent

BAD = MISSING_ZERO_GRAD
FIXED = BAD.replace("    loss = model", "    opt.zero_grad()\n    loss = model")


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"})


def _hook_repo(tmp_path):
    """A git repository holding this project's installable files, committed
    (pre-commit clones hook repositories, so it sees only committed files)."""
    repo = tmp_path / "hook-repo"
    repo.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy(ROOT / name, repo / name)
    for name in ("src", "fixtures"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "hook")
    return repo


def _project(tmp_path, name, text):
    """A user's git repository holding one staged file ``name``."""
    project = tmp_path / "user-project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / name).write_text(text)
    _git(project, "add", name)
    return project


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    """The hook repository and a pre-commit home shared by this module's
    tests, so the hook's environment is installed once."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to run pre-commit")
    base = tmp_path_factory.mktemp("hooks")
    return _hook_repo(base), {**os.environ, "PRE_COMMIT_HOME": str(base / "pre-commit-home")}


@pytest.mark.slow
def test_hook_fails_on_bad_file_and_passes_when_fixed(tmp_path, hooks):
    hook_repo, env = hooks
    project = _project(tmp_path, "train.py", BAD)
    target = project / "train.py"
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "torchgradlint", "--files", "train.py"]

    bad = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "train.py:8:5: TGL001" in bad.stdout

    target.write_text(FIXED)
    _git(project, "add", "train.py")
    good = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


def test_hooks_take_python_files_and_notebooks(tmp_path):
    """pre-commit's own file classification (identify) picks both kinds for both hooks."""
    import yaml
    from identify.identify import tags_from_path

    (tmp_path / "train.py").write_text(BAD)
    (tmp_path / "nb.ipynb").write_text('{"cells": []}')
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"] for h in hooks} == {"torchgradlint", "torchgradlint-fix"}
    for hook in hooks:
        assert "types" not in hook  # types: [python] would skip notebooks
        for name in ("train.py", "nb.ipynb"):
            assert set(hook["types_or"]) & tags_from_path(str(tmp_path / name)), (hook["id"], name)


@pytest.mark.slow
def test_hook_lints_a_notebook(tmp_path, hooks):
    import json

    hook_repo, env = hooks
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": BAD.splitlines(keepends=True)}
    project = _project(tmp_path, "nb.ipynb", json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "torchgradlint", "--all-files"]
    out = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "nb.ipynb:cell 1:8:5: TGL001" in out.stdout


LOSSES = (ROOT / "fixtures" / "TGL101" / "bad_losses_append.py").read_text()


@pytest.mark.slow
def test_fix_hook_applies_the_safe_fix(tmp_path, hooks):
    hook_repo, env = hooks
    project = _project(tmp_path, "train.py", LOSSES)
    target = project / "train.py"
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "torchgradlint-fix", "--files", "train.py"]

    first = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 1, first.stdout + first.stderr  # pre-commit fails when a hook modifies files
    assert "files were modified by this hook" in first.stdout
    assert "losses.append(loss.item())" in target.read_text()

    _git(project, "add", "train.py")
    second = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
