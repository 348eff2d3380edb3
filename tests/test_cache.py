"""Content-hash cache: hits skip linting, any change misses, concurrent runs are safe."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchgradlint import cli, runner
from torchgradlint.cache import Cache

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAD = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()
OK = (FIXTURES / "TGL001" / "ok_zero_grad_each_step.py").read_text()


@pytest.fixture
def tree(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "bad.py").write_text(BAD)
    (project / "ok.py").write_text(OK)
    monkeypatch.chdir(tmp_path)
    return project


def check(capsys, *args):
    rc = cli.main(["check", "--jobs", "1", "--output-format", "json", *args])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def entries(cache_dir):
    return sorted(p for p in Path(cache_dir).rglob("*.json"))


def test_second_run_is_answered_from_the_cache(tree, capsys, monkeypatch):
    rc1, first = check(capsys, str(tree))
    assert rc1 == 1 and {d["code"] for d in first} == {"TGL001"}
    assert len(entries(".torchgradlint_cache")) == 2
    assert (Path(".torchgradlint_cache") / "CACHEDIR.TAG").is_file()

    def no_linting(args):
        raise AssertionError(f"{args[0]} was linted again")

    monkeypatch.setattr(runner, "_lint_one", no_linting)
    rc2, second = check(capsys, str(tree))
    assert (rc2, second) == (rc1, first)


def test_a_changed_file_or_selection_misses(tree, capsys, monkeypatch):
    check(capsys, str(tree))
    linted = []
    real = runner._lint_one
    monkeypatch.setattr(runner, "_lint_one", lambda args: linted.append(Path(args[0]).name) or real(args))

    (tree / "ok.py").write_text(OK + "\n# edited\n")
    check(capsys, str(tree))
    assert linted == ["ok.py"]

    linted.clear()
    rc, found = check(capsys, "--select", "TGL1", str(tree))
    assert sorted(linted) == ["bad.py", "ok.py"] and rc == 0 and found == []


def test_no_cache_writes_nothing(tree, capsys):
    check(capsys, "--no-cache", str(tree))
    assert not Path(".torchgradlint_cache").exists()


def test_cache_dir_option_and_corrupt_entries(tree, capsys, tmp_path):
    where = tmp_path / "elsewhere"
    _, first = check(capsys, "--cache-dir", str(where), str(tree))
    for entry in entries(where):
        entry.write_text("{not json")
    _, second = check(capsys, "--cache-dir", str(where), str(tree))
    assert second == first
    assert all(json.loads(e.read_text()) for e in entries(where))  # rewritten whole


def test_key_covers_bytes_name_selection_and_tool(tmp_path):
    a = Cache(tmp_path, fingerprint="one")
    b = Cache(tmp_path, fingerprint="two")
    base = a.key(b"x", "f.py", "sel")
    assert len({base, a.key(b"y", "f.py", "sel"), a.key(b"x", "g.py", "sel"),
                a.key(b"x", "f.py", "other"), b.key(b"x", "f.py", "sel")}) == 5


def test_concurrent_runs_are_safe(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for i in range(30):
        (project / f"m{i}.py").write_text(BAD.replace("16", str(i)) + f"\n# {i}\n")
    cmd = [sys.executable, "-m", "torchgradlint", "check", "--output-format", "json", "--exit-zero", str(project)]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    results = [json.loads(o[0]) for o in outs]
    assert results[0] == results[1] == results[2] and len(results[0]) == 30
    assert len(entries(tmp_path / ".torchgradlint_cache")) == 30
    assert not list((tmp_path / ".torchgradlint_cache").rglob(".tmp-*"))


def test_a_fully_cached_run_does_not_import_libcst(tree):
    probe = ("import sys; from torchgradlint.cli import main; rc = main(['check', '-q', '--exit-zero', 'project']);"
             " print('LIBCST', 'libcst' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", probe], cwd=tree.parent, capture_output=True, text=True)
    assert "LIBCST True" in first.stdout  # the first run parses
    second = subprocess.run([sys.executable, "-c", probe], cwd=tree.parent, capture_output=True, text=True)
    assert "LIBCST False" in second.stdout, second.stdout + second.stderr
    assert "TGL001" in second.stdout
