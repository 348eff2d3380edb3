"""Content-hash cache: hits skip linting, any change misses, concurrent runs
are safe, one index per run is read and written at most once."""

import json
import os
import time
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


def indexes(cache_dir):
    return sorted(Path(cache_dir).rglob("index.json"))


def entries(cache_dir):
    """The entries of the one index under ``cache_dir``."""
    (index,) = indexes(cache_dir)
    return json.loads(index.read_text())["entries"]


def spy_linting(monkeypatch, log):
    """Record the name of every file linted (workers are forked processes:
    they append to the ``log`` file), and return a reader of the names."""
    real = runner._lint_one

    def spy(args):
        with open(log, "a") as fh:
            fh.write(Path(args[0]).name + "\n")
        return real(args)

    monkeypatch.setattr(runner, "_lint_one", spy)

    def names():
        names = log.read_text().split() if log.exists() else []
        log.unlink(missing_ok=True)
        return names
    return names


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
    linted = spy_linting(monkeypatch, tree.parent / "linted.log")

    (tree / "ok.py").write_text(OK + "\n# edited\n")
    check(capsys, str(tree))
    assert linted() == ["ok.py"]

    rc, found = check(capsys, "--select", "TGL1", str(tree))
    assert sorted(linted()) == ["bad.py", "ok.py"] and rc == 0 and found == []


def test_no_cache_writes_nothing(tree, capsys):
    check(capsys, "--no-cache", str(tree))
    assert not Path(".torchgradlint_cache").exists()


@pytest.mark.parametrize("corruption", ["{not json", '{"format": 2, "entries": []}',
                                        '{"format": 2, "entries": {"x": 1}}'])
def test_cache_dir_option_and_corrupt_index(tree, capsys, tmp_path, monkeypatch, corruption):
    where = tmp_path / "elsewhere"
    _, first = check(capsys, "--cache-dir", str(where), str(tree))
    assert not Path(".torchgradlint_cache").exists()
    (index,) = indexes(where)
    index.write_text(corruption)
    linted = spy_linting(monkeypatch, tmp_path / "linted.log")
    _, second = check(capsys, "--cache-dir", str(where), str(tree))
    assert second == first and sorted(linted()) == ["bad.py", "ok.py"]
    assert len(entries(where)) == 2  # rewritten whole


def test_corrupt_entry_is_a_miss(tmp_path):
    cache = Cache(tmp_path, fingerprint="0" * 16)
    key = cache.key(b"x", "f.py", "sel")
    cache.index_path.parent.mkdir(parents=True)
    cache.index_path.write_text(json.dumps({"format": 2, "entries": {key[0]: [key[1], 1, 0, [["TGL001"]]]}}))
    assert cache.get(key, "f.py") is None


def test_a_fully_cached_run_writes_nothing(tree, capsys):
    check(capsys, str(tree))
    (index,) = indexes(".torchgradlint_cache")
    before = index.stat()
    check(capsys, str(tree))
    after = index.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_old_entries_and_stale_fingerprints_are_pruned(tmp_path):
    today = int(time.time() // 86400)
    old = Cache(tmp_path, fingerprint="a" * 16)
    old.put(old.key(b"x", "f.py", "s"), [], False)
    old.save()
    month_ago = time.time() - 31 * 86400
    os.utime(old.index_path.parent, (month_ago, month_ago))
    recent = Cache(tmp_path, fingerprint="b" * 16)
    recent.put(recent.key(b"x", "f.py", "s"), [], False)
    recent.save()

    cache = Cache(tmp_path, fingerprint="c" * 16)
    stale, used, fresh = (cache.key(b"1", "stale.py", "s"), cache.key(b"2", "used.py", "s"),
                          cache.key(b"3", "fresh.py", "s"))
    for key in (stale, used, fresh):
        cache.put(key, [], True)
    cache.save()
    index = json.loads(cache.index_path.read_text())
    for key in (stale, used):
        index["entries"][key[0]][2] = today - 31  # last used a month ago
    cache.index_path.write_text(json.dumps(index))

    again = Cache(tmp_path, fingerprint="c" * 16)
    assert again.get(used, "used.py") == ([], True)  # an old entry still answers, and is used today
    new = again.key(b"4", "new.py", "s")
    again.put(new, [], False)
    again.save()
    assert set(json.loads(cache.index_path.read_text())["entries"]) == {used[0], fresh[0], new[0]}
    assert not (tmp_path / ("a" * 16)).exists() and (tmp_path / ("b" * 16)).exists()


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


def test_a_save_merges_what_a_concurrent_run_wrote(tmp_path):
    first, second = Cache(tmp_path, fingerprint="f" * 16), Cache(tmp_path, fingerprint="f" * 16)
    a, b = first.key(b"a", "a.py", "s"), second.key(b"b", "b.py", "s")
    assert first.get(a, "a.py") is None and second.get(b, "b.py") is None  # both read the empty index
    first.put(a, [], True)
    second.put(b, [], False)
    first.save()
    second.save()
    third = Cache(tmp_path, fingerprint="f" * 16)
    assert third.get(a, "a.py") == ([], True) and third.get(b, "b.py") == ([], False)


def test_a_fully_cached_run_does_not_import_libcst(tree):
    probe = ("import sys; from torchgradlint.cli import main; rc = main(['check', '-q', '--exit-zero', 'project']);"
             " print('LIBCST', 'libcst' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", probe], cwd=tree.parent, capture_output=True, text=True)
    assert "LIBCST True" in first.stdout  # the first run parses
    second = subprocess.run([sys.executable, "-c", probe], cwd=tree.parent, capture_output=True, text=True)
    assert "LIBCST False" in second.stdout, second.stdout + second.stderr
    assert "TGL001" in second.stdout
