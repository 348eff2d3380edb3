"""Bad input: clear messages and the right exit status, never a traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------
# The bad-input matrix (issue 14): each row an input a new user might hand
# over, and the exit status and message expected from the CLI and flake8.
# A good training file sits beside every input: its finding must survive.

def _chain(n):
    return "import torch\ny = " + " + ".join(["a"] * n) + "\nloss.backward()\n"


def _nested(n):
    return ("import torch\ny = " + "[" * n + "]" * n + "\nfor b in data:\n    loss = model(b)\n"
            "    loss.backward()\n    opt.step()\n")


def _notebook(cell):
    return json.dumps({"cells": [{"cell_type": "code", "source": [cell], "metadata": {}, "outputs": []}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


# CPython accepts this indentation ("    " then "\t    ": both measures agree),
# LibCST's tokenizer alone does not (it wants "\t    " to extend "    ").
TABS = ("import torch\nif ready:\n    if go:\n\t    x = 1\nfor batch in data:\n\tloss = model(batch)\n"
        "\tloss.backward()\n\topt.step()\n")

MATRIX = [
    # (id, file name, content, extra CLI options, exit status, message in the input's output line)
    ("operator-chain-20k", "chain.py", _chain(20000), ["--file-timeout", "1"], 1,
     "TGL000 linting took longer than the file-timeout budget of 1 s"),
    ("subscript-chain-10k", "subs.py", "import torch\ny = x" + "[0]" * 10000 + "\nloss.backward()\n",
     ["--file-timeout", "1"], 1, "TGL000 linting took longer than the file-timeout budget of 1 s"),
    ("notebook-huge-cell", "huge.ipynb", _notebook(_chain(20000)), ["--file-timeout", "1"], 1,
     "TGL000 linting took longer than the file-timeout budget of 1 s"),
    ("over-size-budget", "big.py", BAD_LOOP + "#" * 4000 + "\n", ["--max-file-size", "2000"], 1,
     "TGL000 file is 4,612 bytes, over the max-file-size budget of 2,000 bytes"),
    # 150 levels (CPython allows 200): analysed like any file, the finding found.
    ("nested-lists-150", "nested.py", _nested(150), [], 1, "nested.py:6:5: TGL001"),
    # 300 levels: LibCST parses it (CPython refuses it); the position pass runs
    # on the reported statement only, not through the nested lists: the finding.
    ("nested-lists-300", "nested.py", _nested(300), [], 1, "nested.py:6:5: TGL001"),
    ("notebook-nested-cell", "deep.ipynb", _notebook(_nested(300)), [], 1, "deep.ipynb:cell 1:6:5: TGL001"),
    ("tabs-cpython-accepts", "tabs.py", TABS, [], 1, "tabs.py:8:2: TGL001"),
]


@pytest.mark.parametrize("name,content,options,status,message", [row[1:] for row in MATRIX],
                         ids=[row[0] for row in MATRIX])
def test_bad_input_matrix_cli(tmp_path, name, content, options, status, message):
    (tmp_path / name).write_text(content)
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = run("check", "--no-cache", *options, str(tmp_path / name), str(tmp_path / "train.py"))
    assert out.returncode == status, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if name in line]
    assert len(lines) == 1 and message in lines[0], out.stdout
    assert "train.py:16:9: TGL001" in out.stdout  # the other file's finding is not lost


FLAKE8_MATRIX = [
    # (id, file name, content, pyproject [tool.torchgradlint] body, flake8 exit status, message)
    ("tabs-cpython-accepts", "tabs.py", TABS, "", 1, "tabs.py:8:2: TGL001"),
    ("nested-lists-150", "nested.py", _nested(150), "", 1, "nested.py:6:5: TGL001"),
    ("over-size-budget", "big.py", BAD_LOOP + "#" * 4000 + "\n", "max-file-size = 2000", 1,
     "TGL000 file is 4,612 bytes, over the max-file-size budget of 2,000 bytes"),
    # CPython's own parser refuses more than 200 nested brackets: flake8 says so itself (E999).
    ("nested-lists-1000", "nested.py", _nested(1000), "", 1, "E999 SyntaxError: too many nested parentheses"),
]


@pytest.mark.parametrize("name,content,table,status,message", [row[1:] for row in FLAKE8_MATRIX],
                         ids=[row[0] for row in FLAKE8_MATRIX])
def test_bad_input_matrix_flake8(tmp_path, name, content, table, status, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.torchgradlint]\n{table}\n")
    (tmp_path / name).write_text(content)
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "E999,TGL", name, "train.py"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == status, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith(name)]
    assert len(lines) == 1 and message in lines[0], out.stdout
    assert "train.py:16:9: TGL001" in out.stdout


def test_a_worker_that_dies_costs_only_its_file(tmp_path, monkeypatch, capsys):
    """A native abort (simulated: the worker sends itself SIGABRT on one file)
    is one TGL000 for that file; the run goes on and the next files are linted."""
    import os
    import signal

    from torchgradlint import cli, runner

    real = runner._lint_one

    def aborting(args):
        if args[0].endswith("generated.py"):
            import faulthandler

            faulthandler.disable()  # pytest's handler would print the worker's stack
            os.kill(os.getpid(), signal.SIGABRT)
        return real(args)

    monkeypatch.setattr(runner, "_lint_one", aborting)
    for name in ("generated.py", "a.py", "b.py"):
        (tmp_path / name).write_text(BAD_LOOP)
    rc = cli.main(["check", "--no-cache", "--jobs", "1", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "generated.py:1:1: TGL000 the parser process died (signal SIGABRT)" in out
    assert "a.py:16:9: TGL001" in out and "b.py:16:9: TGL001" in out
    assert "Found 3 findings in 3 files: 2 linted, 1 not parsed." in err


def test_syntax_error_in_a_prefiltered_file_is_counted_as_skipped(tmp_path):
    (tmp_path / "notes.py").write_text("def f(:\n    pass\n")  # no torch: never parsed
    (tmp_path / "ok.py").write_text("import torch\nx = torch.ones(1)\n")
    out = run("check", "--no-cache", str(tmp_path))
    assert out.returncode == 0
    assert out.stderr.strip() == "All checks passed (2 files: 0 linted, 2 skipped by the prefilter)."
    (tmp_path / "train.py").write_text(BAD_LOOP)
    out = run("check", "--no-cache", str(tmp_path))
    assert out.stderr.strip() == "Found 1 finding in 3 files: 1 linted, 2 skipped by the prefilter."


def test_budgets_from_pyproject_and_their_validation(tmp_path):
    (tmp_path / "train.py").write_text(BAD_LOOP)
    (tmp_path / "pyproject.toml").write_text("[tool.torchgradlint]\nmax-file-size = 100\n")
    out = run("check", "--no-cache", str(tmp_path))
    assert out.returncode == 1 and "over the max-file-size budget" in out.stdout
    out = run("check", "--no-cache", "--max-file-size", "0", str(tmp_path))  # the command line wins; 0: no limit
    assert out.returncode == 1 and "TGL001" in out.stdout
    (tmp_path / "pyproject.toml").write_text("[tool.torchgradlint]\nfile-timeout = \"soon\"\n")
    out = run("check", "--no-cache", str(tmp_path))
    assert out.returncode == 2 and "file-timeout must be a number" in out.stderr
    out = run("check", "--file-timeout", "-1", str(tmp_path))
    assert out.returncode == 2 and "must be 0 or more" in out.stderr


def test_a_recursion_error_while_analysing_is_one_tgl000(monkeypatch):
    """What still recurses per nesting level (LibCST's position pass over a
    reported statement, a rule) ends in one ``TGL000``, not a traceback."""
    from torchgradlint import engine
    from torchgradlint.registry import all_rules

    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(engine, "node_ranges", too_deep)
    result = engine.lint_source(_nested(10), "nested.py", [r for r in all_rules() if r.default_enabled])
    assert [(d.code, d.message) for d in result.diagnostics] == [
        ("TGL000", "file is nested too deeply to be analysed, so it was not linted")]
