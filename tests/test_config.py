"""[tool.torchgradlint] in pyproject.toml, driven through the CLI and flake8."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchgradlint import config
from torchgradlint.cli import main
from snippets import MISSING_ZERO_GRAD

BAD = MISSING_ZERO_GRAD


@pytest.fixture(autouse=True)
def _fresh_cache():
    config.clear_cache()
    yield
    config.clear_cache()


def write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def run(capsys, *argv):
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def flagged(out: str) -> set:
    """Files with a TGL001 finding (other rules may exist; BAD targets TGL001)."""
    return {line.split(":")[0] for line in out.splitlines() if ": TGL001 " in line}


def test_ignore_in_config_silences_and_cli_select_overrides(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nignore = ["TGL001"]\n')
    write(tmp_path, "train.py", BAD)
    assert flagged(run(capsys, ".")[1]) == set()
    code, out, _ = run(capsys, ".", "--select", "TGL001")
    assert code == 1 and "train.py:8:5: TGL001" in out
    assert flagged(run(capsys, ".", "--isolated")[1]) == {"train.py"}


def test_select_by_name_and_cli_ignore(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nselect = ["missing-zero-grad"]\n')
    write(tmp_path, "train.py", BAD)
    assert run(capsys, ".")[0] == 1
    assert run(capsys, ".", "--ignore", "missing-zero-grad")[0] == 0


def test_per_file_ignores_glob(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml",
          '[tool.torchgradlint.per-file-ignores]\n"tests/**" = ["TGL001"]\n"scratch_*.py" = ["TGL0"]\n')
    write(tmp_path, "tests/test_train.py", BAD)
    write(tmp_path, "pkg/scratch_a.py", BAD)
    write(tmp_path, "pkg/train.py", BAD)
    code, out, _ = run(capsys, ".")
    assert code == 1
    assert flagged(out) == {"pkg/train.py"}


def test_nearest_config_wins_per_project(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nignore = ["TGL001"]\n')
    write(tmp_path, "a/train.py", BAD)
    write(tmp_path, "b/pyproject.toml", '[tool.torchgradlint]\nselect = ["TGL001"]\n')
    write(tmp_path, "b/train.py", BAD)
    # A pyproject.toml without the table does not stop the walk upwards.
    write(tmp_path, "a/pyproject.toml", '[project]\nname = "a"\n')
    code, out, _ = run(capsys, "a", "b")
    assert code == 1
    assert flagged(out) == {"b/train.py"}


def test_exclude_and_extend_exclude(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nextend-exclude = ["legacy/", "gen_*.py"]\n')
    write(tmp_path, "legacy/old.py", BAD)
    write(tmp_path, "src/gen_model.py", BAD)
    write(tmp_path, "src/train.py", BAD)
    write(tmp_path, "build/copy.py", BAD)  # default exclude still applies with extend-exclude
    code, out, _ = run(capsys, ".")
    assert flagged(out) == {"src/train.py"}
    # Explicit files are linted unless --force-exclude.
    assert flagged(run(capsys, "legacy/old.py")[1]) == {"legacy/old.py"}
    assert run(capsys, "legacy/old.py", "--force-exclude")[1] == ""


def test_exclude_replaces_default_excludes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nexclude = ["skipme/"]\n')
    write(tmp_path, "build/train.py", BAD)
    write(tmp_path, "skipme/train.py", BAD)
    assert flagged(run(capsys, ".")[1]) == {"build/train.py"}


@pytest.mark.parametrize("text, needle", [
    ('[tool.torchgradlint\nselect = 1\n', "invalid TOML"),
    ('[tool.torchgradlint]\nselct = ["TGL001"]\n', "unknown key 'tool.torchgradlint.selct'"),
    ('[tool.torchgradlint]\nselect = "TGL001"\n', "tool.torchgradlint.select must be a list of strings"),
    ('[tool.torchgradlint]\nignore = [1]\n', "tool.torchgradlint.ignore[0] must be a string"),
    ('[tool.torchgradlint]\nextend-select = ["TGL7777"]\n', "tool.torchgradlint.extend-select[0]: unknown rule selector"),
    ('[tool.torchgradlint.per-file-ignores]\n"tests/*" = ["nope"]\n',
     "tool.torchgradlint.per-file-ignores.\"tests/*\"[0]: unknown rule selector 'nope'"),
    ('[tool.torchgradlint.per-file-ignores]\n"tests/*" = "TGL001"\n', "must be a list of strings"),
    ('[tool]\ntorchgradlint = 3\n', "tool.torchgradlint must be a table"),
])
def test_malformed_config_is_a_clear_error(tmp_path, capsys, monkeypatch, text, needle):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "pyproject.toml", text)
    write(tmp_path, "train.py", BAD)
    code, out, err = run(capsys, ".")
    assert code == 2
    assert out == ""
    assert "pyproject.toml" in err and needle in err, err
    assert "Traceback" not in err


def test_malformed_config_subprocess_no_traceback(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nselect = ["TGL001"]\nbogus = true\n')
    write(tmp_path, "train.py", BAD)
    proc = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "."], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown key 'tool.torchgradlint.bogus'" in proc.stderr
    assert str(tmp_path / "pyproject.toml") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_lookup_is_cached_per_directory(tmp_path, monkeypatch):
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nignore = ["ALL"]\n')
    for i in range(5):
        write(tmp_path, f"pkg/m{i}.py", BAD)
    calls = []
    real = config.load_pyproject.__wrapped__
    monkeypatch.setattr(config, "load_pyproject",
                        config.lru_cache(maxsize=None)(lambda p: calls.append(p) or real(p)))
    config._find_for_dir.cache_clear()
    settings = config.Settings()
    for i in range(5):
        assert settings.codes_for(tmp_path / f"pkg/m{i}.py") == ()
    assert calls == [str(tmp_path / "pyproject.toml")]


def test_rule_layers_apply_in_order_then_per_file_ignores():
    from torchgradlint.registry import RuleLayer, resolve_codes, rule_index

    assert "TGL001" not in resolve_codes([RuleLayer(ignore=("TGL001",))])
    assert resolve_codes([RuleLayer(ignore=("ALL",)), RuleLayer(select=("TGL001",))]) == ("TGL001",)
    assert resolve_codes([RuleLayer(select=("TGL001",)), RuleLayer(ignore=("TGL0",))]) == ()
    assert resolve_codes([RuleLayer()], per_file_ignores=("ALL",)) == ()
    graph_rules = [r.code for r in rule_index() if r.code.startswith("TGL1")]
    assert "TGL101" in graph_rules and "TGL102" in graph_rules
    assert resolve_codes([RuleLayer(select=("TGL1",)), RuleLayer(extend_select=("TGL001",))],
                         per_file_ignores=("TGL102",)) == tuple(["TGL001"] + [c for c in graph_rules if c != "TGL102"])


def _flake8(cwd, *args):
    return subprocess.run([sys.executable, "-m", "flake8", "--select", "TGL", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_flake8_plugin_reads_per_file_ignores_and_exclude(tmp_path):
    write(tmp_path, "pyproject.toml", textwrap.dedent("""\
        [tool.torchgradlint]
        extend-exclude = ["legacy/"]
        [tool.torchgradlint.per-file-ignores]
        "tests/*" = ["TGL001"]
    """))
    write(tmp_path, "train.py", BAD)
    write(tmp_path, "tests/test_x.py", BAD)
    write(tmp_path, "legacy/old.py", BAD)
    proc = _flake8(tmp_path, ".")
    assert proc.returncode == 1, proc.stderr
    assert [ln.split(":")[0] for ln in proc.stdout.splitlines()] == ["./train.py"]
    assert ":8:5: TGL001" in proc.stdout


def test_flake8_plugin_own_config_and_malformed_table(tmp_path):
    write(tmp_path, "train.py", BAD)
    write(tmp_path, "setup.cfg", "[flake8]\nper-file-ignores = train.py:TGL001\n")
    assert "TGL001" not in _flake8(tmp_path, "train.py").stdout
    (tmp_path / "setup.cfg").unlink()
    write(tmp_path, "pyproject.toml", '[tool.torchgradlint]\nignore = "TGL001"\n')
    proc = _flake8(tmp_path, "train.py")
    assert "train.py:1:1: TGL000" in proc.stdout and "must be a list of strings" in proc.stdout
    assert "Traceback" not in proc.stderr
