"""Structure of every --output-format, driven through the CLI."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from torchgradlint import config
from torchgradlint.cli import main
from torchgradlint.diagnostics import Diagnostic
from torchgradlint.output.github import escape_data, escape_property, format_command
from torchgradlint.output import FORMAT_NAMES
from torchgradlint.registry import all_rules
from snippets import MISSING_ZERO_GRAD

BAD = MISSING_ZERO_GRAD
CLEAN = "import torch\n\nx = torch.ones(2)\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A repository with one bad file in a subfolder, one clean file and one broken file."""
    config.clear_cache()
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "train.py").write_text(BAD)
    (tmp_path / "src" / "clean.py").write_text(CLEAN)
    (tmp_path / "src" / "broken.py").write_text("import torch\nloss.backward()\nopt.step(\n")
    yield tmp_path
    config.clear_cache()


def run(capsys, *argv):
    code = main(["check", "--select", "TGL001", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_and_json_lines_have_the_same_objects(project, capsys):
    code, out_json, _ = run(capsys, "src", "--output-format", "json")
    assert code == 1
    arr = json.loads(out_json)
    code, out_lines, err = run(capsys, "src", "--output-format", "json-lines")
    assert code == 1 and err == ""
    lines = out_lines.splitlines()
    assert [json.loads(line) for line in lines] == arr
    assert all("\n" not in line for line in lines)
    assert [o["code"] for o in arr] == ["TGL000", "TGL001"]
    obj = arr[1]
    assert obj["filename"] == "src/pkg/train.py"
    assert obj["location"] == {"row": 8, "column": 5} and obj["end_location"] == {"row": 8, "column": 15}
    assert obj["cell"] is None
    assert set(obj) >= {"code", "message", "filename", "location", "end_location", "url", "fix", "noqa_row", "cell"}


def test_github_escaping():
    assert escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    d = Diagnostic("TGL001", "50% of\nsteps: x, y", "dir,1/a:b.py", 3, 4, 3, 9)
    cmd = format_command(d, (3, 4, 3, 9))
    assert cmd == ("::error file=dir%2C1/a%3Ab.py,line=3,col=4,endLine=3,endColumn=9,"
                   "title=TGL001 (missing-zero-grad)::50%25 of%0Asteps: x, y")


def test_github_format(project, capsys):
    code, out, _ = run(capsys, "src", "--output-format", "github")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("::error file=src/pkg/train.py,line=8,col=5,endLine=8,endColumn=15,"
                               "title=TGL001 (missing-zero-grad)::")
    assert lines[0].startswith("::error file=src/broken.py,line=")
    assert "title=TGL000 (parse-error)::" in lines[0]


def _sarif(capsys, *argv):
    code, out, err = run(capsys, *argv, "--output-format", "sarif")
    return code, json.loads(out)


def test_sarif_has_every_field_github_code_scanning_needs(project, capsys):
    code, log = _sarif(capsys, "src")
    assert code == 1
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    (run_,) = log["runs"]
    driver = run_["tool"]["driver"]
    assert driver["name"] == "torchgradlint" and driver["version"] and driver["informationUri"].startswith("https://")
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert ids == ["TGL000"] + [r.code for r in all_rules()]
    for r in rules:
        assert r["name"] and r["shortDescription"]["text"] and r["fullDescription"]["text"]
        assert r["help"]["text"] and r["help"]["markdown"]
        assert r["helpUri"].startswith("https://")
        assert r["defaultConfiguration"]["level"] in ("error", "warning", "note")
    tgl001 = rules[ids.index("TGL001")]
    rule_cls = next(r for r in all_rules() if r.code == "TGL001")
    assert tgl001["help"]["markdown"] == rule_cls.docs.strip()
    assert tgl001["name"] == "missing-zero-grad"
    results = run_["results"]
    assert [r["ruleId"] for r in results] == ["TGL000", "TGL001"]
    for res in results:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["level"] in ("error", "warning", "note") and res["message"]["text"]
        (loc,) = res["locations"]
        art = loc["physicalLocation"]["artifactLocation"]
        assert art["uriBaseId"] == "%SRCROOT%" and "\\" not in art["uri"] and not art["uri"].startswith("/")
        region = loc["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert region["endLine"] >= region["startLine"]
    res = results[1]
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/pkg/train.py"
    assert res["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 8, "startColumn": 5, "endLine": 8, "endColumn": 15}


def test_sarif_uris_are_repo_relative_from_a_subfolder(project, capsys, monkeypatch):
    monkeypatch.chdir(project / "src")
    _, log = _sarif(capsys, "pkg")
    (res,) = log["runs"][0]["results"]
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/pkg/train.py"


def test_sarif_round_trips_through_sarif_pydantic(project, capsys):
    sarif = pytest.importorskip("sarif_pydantic.sarif")
    _, log = _sarif(capsys, "src")
    model = sarif.Sarif.model_validate(log)
    again = json.loads(model.model_dump_json(by_alias=True, exclude_none=True))
    assert again["version"] == "2.1.0"
    run_ = model.runs[0]
    assert run_.tool.driver.name == "torchgradlint"
    rule = run_.tool.driver.rules[1]
    assert rule.id == "TGL001" and rule.help.markdown and rule.short_description.text
    assert rule.full_description.text and rule.help_uri and rule.default_configuration.level
    result = run_.results[1]
    assert result.rule_id == "TGL001" and result.rule_index == 1 and result.message.text
    region = result.locations[0].physical_location.region
    assert (region.start_line, region.start_column, region.end_line, region.end_column) == (8, 5, 8, 15)
    assert result.locations[0].physical_location.artifact_location.uri_base_id == "%SRCROOT%"
    # Round trip: the dumped model validates again and keeps results and rules.
    model2 = sarif.Sarif.model_validate(again)
    assert len(model2.runs[0].results) == 2
    assert [r.id for r in model2.runs[0].tool.driver.rules] == [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]]


def test_sarif_with_no_findings_is_valid(project, capsys):
    code, log = _sarif(capsys, "src/clean.py")
    assert code == 0
    assert log["runs"][0]["results"] == []


def test_junit_structure(project, capsys):
    code, out, _ = run(capsys, "src", "--output-format", "junit")
    assert code == 1
    root = ET.fromstring(out.split("\n", 1)[1] if out.startswith("<?xml") else out)
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"src/broken.py", "src/clean.py", "src/pkg/train.py"}
    clean = suites["src/clean.py"]
    (case,) = clean.findall("testcase")
    assert case.find("failure") is None and clean.get("failures") == "0"
    bad = suites["src/pkg/train.py"]
    assert bad.get("failures") == "1" and bad.get("tests") == "1"
    (case,) = bad.findall("testcase")
    failure = case.find("failure")
    assert failure.get("type") == "TGL001" and "never reset" in failure.get("message")
    assert "zero_grad" in failure.text  # the detail
    assert "src/pkg/train.py:8:5: TGL001" in failure.text
    assert case.get("name").startswith("TGL001 (missing-zero-grad) at 8:5")
    assert root.get("tests") == "3" and root.get("failures") == "2"


def test_full_format_shows_excerpt_and_caret(project, capsys):
    code, out, _ = run(capsys, "src/pkg/train.py", "--output-format", "full")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("src/pkg/train.py:8:5: TGL001 `opt` steps in a loop")
    assert lines[1:7] == ["  |", "6 |     loss = model(torch.randn(2, 4)).sum()", "7 |     loss.backward()",
                          "8 |     opt.step()", "  |     ^^^^^^^^^^ missing-zero-grad", "  |"]
    assert lines[7].startswith("  = So each step applies the sum of all earlier gradients")


@pytest.mark.parametrize("fmt", ["concise", "full", "json", "json-lines", "github", "sarif", "junit"])
def test_every_format_from_a_subprocess(project, fmt):
    proc = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "--select", "TGL001", "src/pkg",
                           "--output-format", fmt], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "train.py" in proc.stdout
    assert "Traceback" not in proc.stderr


_RENDER_IMPORTS = """
import json, sys
from torchgradlint.diagnostics import Diagnostic
from torchgradlint.output import FORMAT_NAMES, RenderContext, renderer
cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
          "source": ["loss = model(x)\\n", "losses.append(loss)\\n"]}]
nb = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)
diags = [Diagnostic("TGL101", "kept", "train.ipynb", 2, 1, 2, 20, cell=1),
         Diagnostic("TGL001", "no reset", "train.py", 1, 1, 1, 5)]
ctx = RenderContext(sources={"train.ipynb": nb, "train.py": "opt.step()\\n"},
                    paths=["train.ipynb", "train.py"])
name = sys.argv[1]
text = renderer(name)(diags, ctx)
print("HEAVY", ",".join(sorted(m for m in sys.modules if m in ("libcst", "torchgradlint.engine")
                                or m.startswith(("torchgradlint.rules.", "torchgradlint.analysis")))))
print("ENGINE", "torchgradlint.engine" in sys.modules)
print("NAMED", "loss-kept-with-graph" in text or name not in ("github", "junit"))
"""


@pytest.mark.parametrize("name", sorted(FORMAT_NAMES))
def test_output_formats_do_not_import_the_engine(name):
    proc = subprocess.run([sys.executable, "-c", _RENDER_IMPORTS, name], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ENGINE False" in proc.stdout and "NAMED True" in proc.stdout, proc.stdout
    heavy = proc.stdout.split("HEAVY ")[1].splitlines()[0]
    if name == "sarif":  # SARIF embeds every rule's docs: it imports the rule classes (not the engine)
        assert "torchgradlint.rules.missing_zero_grad" in heavy
    else:
        assert heavy == "", heavy
