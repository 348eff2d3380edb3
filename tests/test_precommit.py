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
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "hook")
    return repo


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    """The hook repository and a pre-commit home shared by this module's
    tests, so the hook's environment is installed once."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to run pre-commit")
    base = tmp_path_factory.mktemp("hooks")
    return _hook_repo(base), {**os.environ, "PRE_COMMIT_HOME": str(base / "pre-commit-home")}


def test_hook_fails_on_bad_file_and_passes_when_fixed(tmp_path, hooks):
    hook_repo, env = hooks
    project = tmp_path / "user-project"
    project.mkdir()
    _git(project, "init", "-q")
    target = project / "train.py"
    target.write_text(BAD)
    _git(project, "add", "train.py")
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "torchgradlint", "--files", "train.py"]

    bad = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "train.py:8:5: TGL001" in bad.stdout

    target.write_text(FIXED)
    _git(project, "add", "train.py")
    good = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


LOSSES = (ROOT / "fixtures" / "TGL101" / "bad_losses_append.py").read_text()


def test_fix_hook_applies_the_safe_fix(tmp_path, hooks):
    hook_repo, env = hooks
    project = tmp_path / "user-project"
    project.mkdir()
    _git(project, "init", "-q")
    target = project / "train.py"
    target.write_text(LOSSES)
    _git(project, "add", "train.py")
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "torchgradlint-fix", "--files", "train.py"]

    first = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 1, first.stdout + first.stderr  # pre-commit fails when a hook modifies files
    assert "files were modified by this hook" in first.stdout
    assert "losses.append(loss.item())" in target.read_text()

    _git(project, "add", "train.py")
    second = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
