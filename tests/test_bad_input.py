"""Bad input: clear messages and the right exit status, never a traceback."""

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAD_LOOP = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()


def run(*args, cwd=None, stdin=None):
    out = subprocess.run([sys.executable, "-m", "torchgradlint", *args], capture_output=True, text=True,
                         cwd=cwd, input=stdin)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    return out


def test_unparsable_file_is_one_diagnostic_and_others_are_still_linted(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\n\ndef f(:\n    loss.backward()\n    opt.step()\n")
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = run("check", "--output-format", "json", str(tmp_path))
    assert out.returncode == 1
    diags = json.loads(out.stdout)
    broken = [d for d in diags if d["filename"].endswith("broken.py")]
    assert len(broken) == 1
    assert broken[0]["code"] == "TGL000"
    assert broken[0]["location"]["row"] == 3
    assert "could not be parsed" in broken[0]["message"]
    assert {d["code"] for d in diags if d["filename"].endswith("train.py")} == {"TGL001"}


def test_missing_path_is_a_user_error(tmp_path):
    out = run("check", str(tmp_path / "nope.py"))
    assert out.returncode == 2
    assert "nope.py" in out.stderr and "no such file" in out.stderr.lower()


def test_missing_path_does_not_stop_the_other_paths(tmp_path):
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = run("check", str(tmp_path / "nope.py"), str(tmp_path / "train.py"))
    assert out.returncode == 2
    assert "TGL001" in out.stdout


def test_directory_without_python_files_passes_with_a_message(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    out = run("check", str(tmp_path))
    assert out.returncode == 0
    assert "no python files" in out.stderr.lower()


def test_undecodable_bytes_are_one_diagnostic(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"import torch\nx = '\xff\xfe caf\xe9'\n")
    out = run("check", str(tmp_path / "latin.py"))
    assert out.returncode == 1
    assert "TGL000" in out.stdout and "could not be decoded" in out.stdout


def test_declared_encoding_is_honoured(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nimport torch\nx = 'caf\xe9'\n")
    out = run("check", str(tmp_path / "latin.py"))
    assert out.returncode == 0, out.stdout


def test_empty_file_and_comment_only_file_pass(tmp_path):
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "comments.py").write_text("# torch training notes\n# loss.backward() goes here\n")
    out = run("check", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""


def test_stdin_with_filename(tmp_path):
    out = run("check", "-", "--stdin-filename", "train.py", stdin=BAD_LOOP)
    assert out.returncode == 1
    assert out.stdout.startswith("train.py:16:9: TGL001")


def test_unknown_selector_is_a_usage_error(tmp_path):
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = run("check", "--select", "TGL999,nonsense", str(tmp_path))
    assert out.returncode == 2
    assert "unknown rule selector" in out.stderr


def test_unknown_rule_to_explain(tmp_path):
    out = run("rule", "TGL999")
    assert out.returncode == 2 and "no rule" in out.stderr


def test_explicit_directory_inside_a_gitignored_folder_is_linted(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text(".cache/\ngenerated_*.py\n")
    inner = tmp_path / ".cache" / "pkg"
    inner.mkdir(parents=True)
    (inner / "train.py").write_text(BAD_LOOP)
    (inner / "generated_model.py").write_text(BAD_LOOP)
    out = run("check", str(inner))
    assert out.returncode == 1, out.stderr
    assert "train.py" in out.stdout
    assert "generated_model.py" not in out.stdout  # rules below the named directory still apply
    walked = run("check", str(tmp_path))
    assert ".cache" not in walked.stdout  # walking from above still skips the ignored folder
