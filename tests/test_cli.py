"""The ``torchgradlint check`` command as a user drives it."""

import io
import os
import subprocess
import sys
import textwrap

import pytest

from torchgradlint.cli import main
from snippets import MISSING_ZERO_GRAD

BAD = MISSING_ZERO_GRAD


pytestmark = pytest.mark.usefixtures("isolated_cwd")  # tests/conftest.py


def run(capsys, *argv):
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def many_files(root, n=25, bad=(3,)):
    pkg = root / "pkg"
    pkg.mkdir(exist_ok=True)
    for i in range(n):
        (pkg / f"m{i:02d}.py").write_text(BAD if i in bad else "import torch\nx = torch.ones(1)\n")
    return pkg


def test_missing_path_is_an_error_but_other_paths_are_linted(tmp_path, capsys):
    (tmp_path / "train.py").write_text(BAD)
    rc, out, err = run(capsys, "nope.py", "train.py", "--select", "TGL001")
    assert rc == 2
    assert "nope.py: no such file or directory" in err
    assert "train.py:8:5: TGL001" in out


def test_directory_without_python_files_is_a_warning(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "readme.md").write_text("hi")
    rc, out, err = run(capsys, "docs")
    assert rc == 0 and out == ""
    assert "warning: docs: no Python files found" in err
    (tmp_path / "train.py").write_text(BAD)
    assert run(capsys, "docs", "train.py", "--select", "TGL001")[0] == 1


def test_stdin_filename_applies_per_file_ignores(tmp_path, capsys, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.torchgradlint.per-file-ignores]\n"scripts/*" = ["TGL001"]\n')

    def feed():
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD.encode())))

    feed()
    assert run(capsys, "-", "--stdin-filename", "scripts/train.py")[0] == 0
    feed()
    rc, out, _ = run(capsys, "-", "--stdin-filename", "src/train.py", "--select", "TGL001")
    assert rc == 1 and out.startswith("src/train.py:8:5: TGL001")


def test_output_is_sorted_by_path_line_column(tmp_path, capsys):
    two = BAD + textwrap.dedent("""\
        for _ in range(2):
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            opt.step()
    """)
    for name in ("z.py", "a.py", "m.py"):
        (tmp_path / name).write_text(two)
    rc, out, _ = run(capsys, "z.py", "m.py", "a.py", "--select", "TGL001", "-j", "2")
    locs = [(p, int(line), int(col)) for p, line, col, _ in (ln.split(":", 3) for ln in out.splitlines())]
    assert locs == sorted(locs) and len(locs) == 6


def test_statistics_plain_when_not_a_tty(tmp_path, capsys):
    many_files(tmp_path, n=3, bad=(0, 1))
    rc, out, err = run(capsys, "pkg", "--select", "TGL001", "--statistics")
    assert rc == 1
    assert out == "     2\tTGL001\tmissing-zero-grad\n"


def test_no_progress_bar_when_not_a_tty_and_rich_not_imported(tmp_path):
    many_files(tmp_path)
    script = ("import sys; from torchgradlint.cli import main; rc = main(['check', 'pkg', '--select', 'TGL001']); "
              "print('rich' in sys.modules, rc)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.stdout.splitlines()[-1] == "False 1"
    assert proc.stderr == "Found 1 finding in 25 files: 1 linted, 24 skipped by the prefilter.\n"


def _run_with_tty_stderr(args, cwd):
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "torchgradlint", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=slave, env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate()
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_bar_on_a_terminal_and_quiet(tmp_path):
    many_files(tmp_path)
    rc, out, err = _run_with_tty_stderr(["check", "pkg", "--select", "TGL001"], tmp_path)
    assert rc == 1
    assert "pkg/m03.py:8:5: TGL001" in out
    assert "Linting" in err and "25/25" in err
    rc, out, err = _run_with_tty_stderr(["check", "pkg", "--select", "TGL001", "--quiet"], tmp_path)
    assert rc == 1 and "Linting" not in err and err.strip() == ""


def test_bad_cli_selector_is_exit_2(capsys):
    rc, out, err = run(capsys, ".", "--select", "TGL7777")
    assert rc == 2 and "unknown rule selector" in err
