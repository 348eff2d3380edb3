"""Short messages with a detail, ruff's ``[*]`` fixable marks and summary,
fix information in json/sarif, JSON statistics, ``rule TGL000``."""

import json

import pytest

from conftest import FIXTURES
from torchgradlint.cli import main, summary
from torchgradlint.diagnostics import Diagnostic, Fix, split_message
from torchgradlint.engine import lint_file
from torchgradlint.registry import all_rules
from torchgradlint.runner import RunResult
from test_cli_errors import FIXABLE

pytestmark = pytest.mark.usefixtures("isolated_cwd")  # tests/conftest.py


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


BAD_FIXTURES = sorted(FIXTURES.glob("TGL*/bad_*.py"))


@pytest.mark.parametrize("path", BAD_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_messages_are_one_short_line_with_a_detail(path):
    diags = [d for d in lint_file(str(path), all_rules()).diagnostics]
    assert diags
    for d in diags:
        assert "\n" not in d.message and len(d.message) <= 120, d.message
        assert d.detail and d.detail[0].isupper() and d.detail.endswith("."), d.detail


def test_split_message_cuts_after_the_first_clause_outside_code_and_parentheses():
    assert split_message("`a, b` is stored in `xs`, so memory grows; store `.item()`") == (
        "`a, b` is stored in `xs`", "So memory grows; store `.item()`.")
    assert split_message("`m` may be training (trained before, no eval): dropout runs") == (
        "`m` may be training", "Trained before, no eval: dropout runs.")
    assert split_message("no clause here") == ("no clause here", "")


def test_concise_marks_fixable_findings_and_counts_them(isolated_cwd, capsys):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    code, out, err = run(capsys, "check", "--no-cache", "t.py")
    assert code == 1
    assert out == "t.py:10:5: TGL101 [*] `loss` is stored in `losses` with its autograd graph\n"
    assert err == "Found 1 finding in 1 file.\n[*] 1 fixable with `--fix`.\n"


def diag(safe):
    return Diagnostic("TGL101", "m", "t.py", 1, 1, 1, 2, Fix((1, 1), (1, 2), "x", safe))


def test_summary_counts_safe_and_hidden_unsafe_fixes():
    run_ = RunResult(diagnostics=[diag(True), diag(False), diag(False)], files=2)
    assert summary(run_) == ("Found 3 findings in 2 files.\n"
                             "[*] 1 fixable with `--fix` (2 hidden fixes can be enabled with `--unsafe-fixes`).")
    assert summary(run_, unsafe=True) == "Found 3 findings in 2 files.\n[*] 3 fixable with `--fix --unsafe-fixes`."
    only_unsafe = RunResult(diagnostics=[diag(False)], files=1)
    assert summary(only_unsafe).endswith("No fixes available (1 hidden fix can be enabled with `--unsafe-fixes`).")
    assert summary(RunResult(files=1)) == "All checks passed (1 file)."


def test_unsafe_fix_is_marked_only_with_unsafe_fixes():
    from torchgradlint.output.concise import format_line

    assert "[*]" not in format_line(diag(False)) and "[*]" in format_line(diag(False), unsafe=True)


def test_json_carries_name_detail_and_fix(isolated_cwd, capsys):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    _, out, _ = run(capsys, "check", "--no-cache", "t.py", "--output-format", "json")
    (obj,) = json.loads(out)
    assert obj["name"] == "loss-kept-with-graph"
    assert obj["message"] == "`loss` is stored in `losses` with its autograd graph"
    assert obj["detail"].startswith("Kept alive across iterations")
    assert obj["fix"] == {"applicability": "safe", "message": "Replace with `loss.item()`", "edits": [
        {"content": "loss.item()", "location": {"row": 10, "column": 19}, "end_location": {"row": 10, "column": 23}}]}


def test_sarif_has_the_short_message_the_detail_and_the_fix(isolated_cwd, capsys):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    _, out, _ = run(capsys, "check", "--no-cache", "t.py", "--output-format", "sarif")
    (res,) = json.loads(out)["runs"][0]["results"]
    assert res["message"]["text"] == "`loss` is stored in `losses` with its autograd graph"
    assert res["properties"]["detail"].startswith("Kept alive across iterations")
    (fix,) = res["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "t.py"
    assert change["replacements"] == [{"deletedRegion": {"startLine": 10, "startColumn": 19, "endLine": 10,
                                                         "endColumn": 23},
                                       "insertedContent": {"text": "loss.item()"}}]
    sarif = pytest.importorskip("sarif_pydantic.sarif")
    model = sarif.Sarif.model_validate(json.loads(out))  # the fix is valid SARIF 2.1.0
    (validated,) = model.runs[0].results[0].fixes
    assert validated.artifact_changes[0].replacements[0].inserted_content.text == "loss.item()"


def test_statistics_honour_json(isolated_cwd, capsys):
    (isolated_cwd / "t.py").write_text(FIXABLE)
    code, out, _ = run(capsys, "check", "--no-cache", "t.py", "--statistics", "--output-format", "json")
    assert code == 1
    assert json.loads(out) == [{"code": "TGL101", "name": "loss-kept-with-graph", "count": 1, "fixable": 1}]


@pytest.mark.parametrize("name", ["TGL000", "parse-error", "tgl000"])
def test_rule_tgl000_is_explained(capsys, name):
    code, out, err = run(capsys, "rule", name)
    assert code == 0 and err == ""
    assert out.startswith("# parse-error (TGL000)") and "internal error" in out and "decoded" in out
