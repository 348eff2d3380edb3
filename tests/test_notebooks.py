"""Jupyter notebooks: cells linted as one program, findings mapped back to cells."""

import io
import json
import subprocess
import sys

import pytest

from torchgradlint.cli import main
from torchgradlint.notebook import join_cells, json_positions


def code(*lines, as_string=False):
    src = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": "".join(src) if as_string else src}


def md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": [text]}


def notebook(*cells, language="python"):
    return {"cells": list(cells), "metadata": {"language_info": {"name": language}},
            "nbformat": 4, "nbformat_minor": 5}


SETUP = code("%matplotlib inline", "!pip install -q torch", "import torch",
             "model = torch.nn.Linear(4, 1)", "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
TIMED = code("%%time", "x = 1 +")  # a cell magic: not Python, must be skipped
LOOP = code("files = !ls", "for _ in range(3):", "    %time y = 1", "    loss = model(torch.randn(2, 4)).sum()",
            "    loss.backward()", "    opt.step()")


pytestmark = pytest.mark.usefixtures("isolated_cwd")  # tests/conftest.py


def write_nb(path, nb, indent=1):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=indent), encoding="utf-8")
    return path


def run(capsys, *argv):
    rc = main(["check", "--select", "TGL001", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_finding_is_reported_by_cell_and_line(tmp_path, capsys):
    write_nb(tmp_path / "nb.ipynb", notebook(md("# Train"), SETUP, TIMED, LOOP))
    rc, out, err = run(capsys, "nb.ipynb")
    assert rc == 1, err
    assert out.splitlines() == [out.splitlines()[0]]
    assert out.startswith("nb.ipynb:cell 3:6:5: TGL001 `opt` steps")


def test_magics_keep_line_numbers():
    joined = join_cells(["%matplotlib inline\nimport torch", "%%bash\nls\n", "x = !ls\nfor i in y:\n    !echo\n"])
    lines = joined.source.splitlines()
    assert lines == ["pass", "import torch", "", "", "pass", "for i in y:", "    pass"]
    assert joined.locate(6) == (3, 2)
    compile(joined.source, "nb", "exec")


def test_help_lines_keep_line_numbers():
    joined = join_cells(["torch.*Tensor?\nnp.sum??\n??torch.nn\n?x\n  y.z?\nx = a ? b"])
    assert joined.source.splitlines() == ["pass", "pass", "pass", "pass", "  pass", "x = a ? b"]


def test_lines_that_continue_a_statement_are_python_not_magics():
    # rasbt's and d2l-pytorch's notebooks: ``print('...'\n      % (epoch, loss))`` (a continuation
    # line that starts with ``%``) was taken for a line magic and the cell reported as TGL000
    cell = ("print('epoch %d'\n      % (epoch + 1))\nok = (a\n      != b)\ny = 1 + \\\n    2\n"
            "s = \"\"\"\n%not a magic\n\"\"\"\nz = 'a(' # (\n%time w = 1\n!ls")
    lines = join_cells([cell]).source.splitlines()
    assert lines[:10] == cell.splitlines()[:10]
    assert lines[10:] == ["pass", "pass"]


def test_magics_written_without_percent_are_ipython_automagic():
    """huggingface/notebooks' diffusers notebooks start with ``pip install diffusers ...`` (no ``!``
    or ``%``): IPython runs it as the ``%pip`` magic. A line that is Python stays Python."""
    cell = ("pip install diffusers torch\ncd ..\nmatplotlib inline\n  time model.fit(x)\n"
            "time.sleep(1)\ncat = 3\npip = [1]\nls -la\nrun(x)")
    assert join_cells([cell]).source.splitlines() == [
        "pass", "pass", "pass", "  pass", "time.sleep(1)", "cat = 3", "pip = [1]", "ls -la", "run(x)"]


def test_a_shell_escape_continued_by_a_backslash_is_one_escape():
    # jeffheaton's t81_558 notebooks: ``!python detect.py --weights yolov5s.pt \`` then ``  --conf 0.25``
    cell = "!python detect.py --weights w.pt \\\n  --conf 0.25 \\\n  --source img/\nx = 1\n%time y = 2"
    assert join_cells([cell]).source.splitlines() == ["pass", "", "", "x = 1", "pass"]


def test_json_has_cell_field_and_full_shows_cell_line(tmp_path, capsys):
    write_nb(tmp_path / "nb.ipynb", notebook(SETUP, LOOP))
    _, out, _ = run(capsys, "nb.ipynb", "--output-format", "json")
    (obj,) = json.loads(out)
    assert obj["cell"] == 2 and obj["location"] == {"row": 6, "column": 5}
    _, out, _ = run(capsys, "nb.ipynb", "--output-format", "full")
    assert "6 |     opt.step()" in out.splitlines()


def test_sarif_region_points_into_the_notebook_json(tmp_path, capsys):
    path = write_nb(tmp_path / "nb.ipynb", notebook(md("text"), SETUP, LOOP))
    _, out, _ = run(capsys, "nb.ipynb", "--output-format", "sarif")
    (res,) = json.loads(out)["runs"][0]["results"]
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "nb.ipynb"
    region = loc["region"]
    raw_line = path.read_text().splitlines()[region["startLine"] - 1]
    assert raw_line[region["startColumn"] - 1:region["endColumn"] - 1] == "opt.step()"
    assert "cell 2, line 6" in res["message"]["text"]
    _, out, _ = run(capsys, "nb.ipynb", "--output-format", "github")
    assert f"line={region['startLine']},col={region['startColumn']}," in out
    assert "::cell 2, line 6: " in out


def test_json_positions_with_escapes_and_string_sources():
    nb = notebook(code('s = "a\\tb"; t = "é"', "x = 1"), code("y = 2", as_string=True))
    raw = json.dumps(nb, indent=1, ensure_ascii=False)
    pos = json_positions(raw)
    assert (1, 1) in pos and (1, 2) in pos and (2, 1) not in pos


def test_noqa_in_a_cell(tmp_path, capsys):
    loop = code("for _ in range(3):", "    loss = model(torch.randn(2, 4)).sum()", "    loss.backward()",
                "    opt.step()  # noqa: TGL001")
    write_nb(tmp_path / "nb.ipynb", notebook(SETUP, loop))
    assert run(capsys, "nb.ipynb")[0] == 0


def test_malformed_notebook_is_one_diagnostic(tmp_path, capsys):
    (tmp_path / "broken.ipynb").write_text('{"cells": [', encoding="utf-8")
    (tmp_path / "shape.ipynb").write_text('{"cells": 3}', encoding="utf-8")
    rc, out, err = run(capsys, ".")
    lines = out.splitlines()
    assert rc == 1 and len(lines) == 2 and "Traceback" not in err
    assert lines[0].startswith("broken.ipynb:1:1: TGL000 notebook could not be read")
    assert "invalid JSON" in lines[0]
    assert lines[1].startswith("shape.ipynb:1:1: TGL000") and "cells" in lines[1]


def test_notebooks_are_discovered_in_directories(tmp_path, capsys):
    write_nb(tmp_path / "exp" / "a.ipynb", notebook(SETUP, LOOP))
    write_nb(tmp_path / "exp" / ".ipynb_checkpoints" / "a-checkpoint.ipynb", notebook(SETUP, LOOP))
    write_nb(tmp_path / "exp" / "r.ipynb", notebook(SETUP, LOOP, language="R"))
    rc, out, _ = run(capsys, "exp")
    assert rc == 1
    assert [line.split(":")[0] for line in out.splitlines()] == ["exp/a.ipynb"]


def test_per_file_ignores_and_stdin_filename_apply_to_notebooks(tmp_path, capsys, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.torchgradlint.per-file-ignores]\n"*.ipynb" = ["TGL001"]\n')
    write_nb(tmp_path / "nb.ipynb", notebook(SETUP, LOOP))
    assert run(capsys, "nb.ipynb")[0] == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(notebook(SETUP, LOOP)).encode())))
    rc, out, _ = run(capsys, "-", "--stdin-filename", "other.ipynb", "--isolated")
    assert rc == 1 and out.startswith("other.ipynb:cell 2:6:5: TGL001")


def test_notebook_from_a_subprocess(tmp_path):
    write_nb(tmp_path / "nb.ipynb", notebook(SETUP, LOOP), indent=None)
    proc = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "nb.ipynb"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "nb.ipynb:cell 2:6:5: TGL001" in proc.stdout


def test_a_cell_whose_first_line_is_indented_runs_as_ipython_runs_it(tmp_path, capsys):
    """rasbt's machine-learning-book ch13: a cell `` def compute_z(a, b, c):`` (one stray space) runs
    in Jupyter, whose first input cleanup removes the first line's indentation from every line that
    starts with it; it is linted, and columns are those of the cell."""
    loop = code("  for _ in range(3):", "      loss = model(torch.randn(2, 4)).sum()", "      loss.backward()",
                "      opt.step()")
    write_nb(tmp_path / "nb.ipynb", notebook(SETUP, loop))
    rc, out, _ = run(capsys, "nb.ipynb")
    assert rc == 1 and out.startswith("nb.ipynb:cell 2:4:7: TGL001 `opt` steps")
    joined = join_cells([" def f(a):\n    return a\n", "  x = 1\n y = 2\n"])
    assert joined.source.splitlines() == ["def f(a):", "   return a", "x = 1", " y = 2"]
    assert joined.shifts == {0: 1, 1: 1, 2: 2}
