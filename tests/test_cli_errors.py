"""Errors are never hidden: ``--diff`` with a missing path or a crashing
file, a directory walk over symlink loops and unreadable folders, an internal
error in a rule (a ``TGL000`` for that file, exit 2, never "All checks
passed")."""

import os

import pytest

from torchgradlint.cli import main
from torchgradlint.rules.loss_kept_with_graph import LossKeptWithGraph
from snippets import MISSING_ZERO_GRAD

FIXABLE = (
    "import torch\n"
    "model = torch.nn.Linear(2, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "losses = []\n"
    "for step in range(3):\n"
    "    opt.zero_grad()\n"
    "    loss = model(torch.randn(4, 2)).sum()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    losses.append(loss)\n"
)

pytestmark = pytest.mark.usefixtures("isolated_cwd")  # tests/conftest.py


def run(capsys, *argv):
    code = main(["check", "--no-cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def crash(self, model):
    raise RuntimeError("boom in a rule")


def test_diff_with_a_missing_path_exits_2_and_says_so(isolated_cwd, capsys):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    code, out, err = run(capsys, "--diff", "missing.py", "t.py")
    assert code == 2
    assert "missing.py: no such file or directory" in err
    assert "+    losses.append(loss.item())" in out  # the other file's diff is still printed


def test_diff_reports_a_file_that_crashes(isolated_cwd, capsys, monkeypatch):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    monkeypatch.setattr(LossKeptWithGraph, "check", crash)
    code, out, err = run(capsys, "--diff", "t.py")
    assert code == 2
    assert "t.py: internal error while linting" in err and "boom in a rule" in err


def test_internal_error_is_a_tgl000_finding_never_all_checks_passed(isolated_cwd, capsys, monkeypatch):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    monkeypatch.setattr(LossKeptWithGraph, "check", crash)
    code, out, err = run(capsys, "t.py")
    assert code == 2
    assert out.startswith("t.py:1:1: TGL000 internal error, so the file was not linted (please report): "
                          "RuntimeError: boom in a rule")
    assert "Traceback" in err and "All checks passed" not in err
    assert "Found 1 finding in 1 file: 0 linted, 1 not parsed." in err


def test_internal_error_on_standard_input(isolated_cwd, capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(LossKeptWithGraph, "check", crash)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(FIXABLE.encode())))
    code, out, err = run(capsys, "-")
    assert code == 2 and "TGL000 internal error" in out and "All checks passed" not in err


def test_walk_survives_a_symlink_loop(isolated_cwd, capsys):
    tree = isolated_cwd / "proj"
    (tree / "sub").mkdir(parents=True)
    (tree / "train.py").write_text(MISSING_ZERO_GRAD)
    os.symlink("loop.py", tree / "loop.py")  # points at itself
    os.symlink("..", tree / "sub" / "up")  # a directory cycle: not followed
    code, out, err = run(capsys, "proj")
    assert code == 1, err
    assert "Traceback" not in err
    assert "proj/train.py:8:5: TGL001" in out
    assert "warning: proj/loop.py: skipped, Too many levels of symbolic links" in err


def test_walk_survives_an_unreadable_folder(isolated_cwd, capsys, monkeypatch):
    tree = isolated_cwd / "proj"
    (tree / "locked").mkdir(parents=True)
    (tree / "train.py").write_text(MISSING_ZERO_GRAD)
    (tree / "locked" / "x.py").write_text(MISSING_ZERO_GRAD)
    real_scandir = os.scandir

    def scandir(path):  # tests may run as root, where chmod 000 does not lock a folder
        if os.path.basename(os.fspath(path)) == "locked":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, out, err = run(capsys, "proj")
    assert code == 1 and "Traceback" not in err
    assert out.startswith("proj/train.py:8:5: TGL001") and "locked" not in out
    assert "warning: proj/locked: skipped, Permission denied" in err
