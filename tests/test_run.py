"""``torchgradlint run`` and ``torchgradlint.watch()`` on user-style scripts.

Each script under tests/harness_programs/user_scripts/ marks the line where its defect
must be measured with ``# measured: CODE``; ``healthy.py`` must measure nothing.
"""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.fixture_spec import load_fixtures  # noqa: E402
from torchgradlint.harness.run import main as run_main, resolve_probes, split_argv, watch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "harness_programs" / "user_scripts"
MARK = re.compile(r"#\s*measured:\s*(TGL\d{3})")


def marked(script: Path) -> set:
    return {(m.group(1), i) for i, line in enumerate(script.read_text().splitlines(), 1) if (m := MARK.search(line))}


def cli(*args: str, cwd: Path = SCRIPTS) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchgradlint", "run", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd)


CORE = ["tgl001_dataloader.py", "tgl002_no_grad_step.py", "tgl101_running_total.py", "tgl102_retain.py",
        "tgl201_validate.py"]


@pytest.mark.slow
@pytest.mark.parametrize("script", CORE)
def test_run_measures_core_defect_at_its_line(script):
    proc = cli("--output-format", "json", script)
    assert proc.returncode == 1, proc.stderr
    found = {(d["code"], d["location"]["row"]) for d in json.loads(proc.stdout[proc.stdout.index("["):])}
    assert found == marked(SCRIPTS / script), proc.stdout
    for d in json.loads(proc.stdout[proc.stdout.index("["):]):
        assert "measured at run time" in d["message"]
        assert "confirms the static finding" in d["message"]


FORMAT_LINES = {
    "concise": lambda text, name: {(m.group(2), int(m.group(1))) for m in
                                   re.finditer(rf"^{re.escape(name)}:(\d+):\d+: (TGL\d{{3}}) ", text, re.M)},
    "github": lambda text, name: {(m.group(2), int(m.group(1))) for m in
                                  re.finditer(rf"^::\w+ file={re.escape(name)},line=(\d+),.*?title=(TGL\d{{3}})", text, re.M)},
    "json": lambda text, name: {(d["code"], d["location"]["row"]) for d in json.loads(text)
                                if d["filename"] == name},
    "sarif": lambda text, name: {(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
                                 for r in json.loads(text)["runs"][0]["results"]
                                 if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(name)},
}


@pytest.mark.slow
@pytest.mark.parametrize("script", CORE)
def test_run_core_defects_in_every_output_format(script, monkeypatch, tmp_path, capsys):
    """In-process (no torch import per run): each format names the defect's code at its line."""
    monkeypatch.chdir(SCRIPTS)
    for fmt, parse in FORMAT_LINES.items():
        out = tmp_path / f"report.{fmt}"
        assert run_main(["--output-format", fmt, "--output", str(out), script]) == 1
        assert parse(out.read_text(), script) == marked(SCRIPTS / script), (fmt, out.read_text())
    capsys.readouterr()


# -- the rules added after the core five: each fixture under `run` with every probe on -------------------
NEW_RULES = ["TGL006", "TGL007", "TGL103", "TGL104", "TGL203", "TGL303", "TGL304", "TGL305"]
NEW_FIXTURES = [f for f in load_fixtures(ROOT / "fixtures") if f.code in NEW_RULES]


def run_fixture(fixture, monkeypatch, tmp_path, *options):
    """``torchgradlint run --output-format json [options] fixture.py`` in-process, in the fixture's folder."""
    monkeypatch.chdir(fixture.path.parent)
    out = tmp_path / "report.json"
    rc = run_main(["--output-format", "json", "--output", str(out), *options, fixture.path.name])
    return rc, json.loads(out.read_text())


# -- every fixture of every rule under `run` with every probe on ----------------------------------------
ALL_FIXTURES = load_fixtures(ROOT / "fixtures")


def statement_lines(path: Path) -> set:
    """Lines where a statement or a decorator of ``path`` starts (a diagnostic must sit on code, not a
    docstring or blank)."""
    import ast

    nodes = list(ast.walk(ast.parse(path.read_text())))
    return {n.lineno for n in nodes if isinstance(n, ast.stmt)} | \
        {d.lineno for n in nodes for d in getattr(n, "decorator_list", ())}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", [f for f in ALL_FIXTURES if f.kind == "ok"], ids=lambda f: f.name)
def test_run_reports_nothing_on_every_ok_fixture(fixture, monkeypatch, tmp_path, capsys):
    """An ok fixture is healthy: ``run`` with all probes measures no defect of any rule."""
    rc, found = run_fixture(fixture, monkeypatch, tmp_path)
    capsys.readouterr()
    assert (rc, found) == (0, []), [(d["code"], d["location"]["row"], d["message"]) for d in found]


@pytest.mark.slow
@pytest.mark.parametrize("fixture", [f for f in ALL_FIXTURES if f.kind == "bad"], ids=lambda f: f.name)
def test_run_measures_every_bad_fixtures_rule_at_an_expected_line(fixture, monkeypatch, tmp_path, capsys):
    """A bad fixture's own rule is measured at a line its ``# expect:`` comments name, and every diagnostic
    (of any rule) sits on a statement of the fixture."""
    rc, found = run_fixture(fixture, monkeypatch, tmp_path)
    capsys.readouterr()
    assert rc == 1
    own = {(d["code"], d["location"]["row"]) for d in found if d["code"] == fixture.code}
    assert own & set(fixture.expected), found
    lines = statement_lines(fixture.path)
    for d in found:
        assert d["filename"] == fixture.path.name and d["location"]["row"] in lines, d
    if fixture.code in NEW_RULES:  # their probes measure nothing else in their fixtures, each line confirmed
        assert {(d["code"], d["location"]["row"]) for d in found} == set(fixture.expected), found
        for d in found:
            measured = d["message"].split("measured at run time: ", 1)[1]
            assert re.search(r"\d", measured), d["message"]  # the measured figure
            assert "confirms the static finding" in d["message"]


def test_findings_of_one_code_on_one_line_are_one_diagnostic(monkeypatch, tmp_path, capsys):
    """nanoGPT's update without a reset: both AdamW parameter groups are stale at the one
    ``scaler.step(optimizer)``; ``run`` reports that line once, with each group's figure."""
    fixture = next(f for f in ALL_FIXTURES if f.name == "TGL001/bad_clip_unscale_no_reset")
    rc, found = run_fixture(fixture, monkeypatch, tmp_path, "--probes", "stale-gradients")
    capsys.readouterr()
    assert rc == 1
    assert [(d["code"], d["location"]["row"]) for d in found] == list(fixture.expected)
    message = found[0]["message"]
    assert "AdamW#1 group 0: stale-gradient steps" in message and "AdamW#1 group 1: stale-gradient steps" in message


def test_a_finding_without_a_line_goes_to_the_entry_line_and_says_so(tmp_path):
    from torchgradlint.harness.run import first_statement, to_diagnostic

    script = tmp_path / "train.py"
    script.write_text('"""Docstring."""\n\nimport os\n\nprint(os.sep)\n')
    finding = {"code": "TGL003", "stack": [], "display": "a reset discarded 3 backwards' gradients"}
    at_entry = to_diagnostic(finding, None, str(script), (str(script), 5))
    assert at_entry.line == 5 and "no line attributed" in at_entry.message
    assert first_statement(str(script)) == 3
    no_entry = to_diagnostic(finding, None, str(script))
    assert no_entry.line == 3 and "no line attributed" in no_entry.message and "first statement" in no_entry.message


def session_on(tmp_path, source: str, probes: list):
    """``(Session, script path)`` after running ``source`` as a script under ``probes`` in-process."""
    import runpy

    from torchgradlint.harness.run import Session

    script = tmp_path / "prog.py"
    script.write_text(source)
    with Session(probes) as session:
        runpy.run_path(str(script), run_name="__main__")
    return session, script


def test_session_entry_is_the_programs_outermost_line_not_the_launcher(tmp_path):
    session, script = session_on(tmp_path, "import torch\n\ndef train():\n"
                                 "    torch.nn.Linear(2, 1)(torch.randn(3, 2)).sum().backward()\n\ntrain()\n",
                                 ["grad-mode"])
    assert session.entry == (str(script), 6)


@pytest.mark.slow
@pytest.mark.parametrize("code", NEW_RULES)
def test_run_new_rules_in_every_output_format(code, monkeypatch, tmp_path, capsys):
    fixture = next(f for f in NEW_FIXTURES if f.code == code and f.kind == "bad")
    monkeypatch.chdir(fixture.path.parent)
    for fmt, parse in FORMAT_LINES.items():
        out = tmp_path / f"report.{fmt}"
        assert run_main(["--probes", code, "--output-format", fmt, "--output", str(out), fixture.path.name]) == 1
        assert parse(out.read_text(), fixture.path.name) == set(fixture.expected), (fmt, out.read_text())
    capsys.readouterr()


@pytest.mark.slow
def test_run_healthy_script_reports_nothing():
    proc = cli("healthy.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 defects measured" in proc.stderr
    assert "TGL" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fmt, pattern", [
    ("concise", r"^tgl201_validate\.py:16:\d+: TGL201 no-grad-without-eval: measured at run time"),
    ("github", r"^::error file=tgl201_validate\.py,line=16,|^::warning file=tgl201_validate\.py,line=16,"),
])
def test_run_text_formats(fmt, pattern):
    proc = cli("--output-format", fmt, "--probes", "module-mode", "tgl201_validate.py")
    assert proc.returncode == 1, proc.stderr
    assert re.search(pattern, proc.stdout, re.M), proc.stdout


@pytest.mark.slow
def test_run_sarif_to_file(tmp_path):
    out = tmp_path / "run.sarif"
    proc = cli("--output-format", "sarif", "--output", str(out), "--probes", "TGL201", "tgl201_validate.py")
    assert proc.returncode == 1, proc.stderr
    sarif = json.loads(out.read_text())
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "TGL201"
    loc = result["locations"][0]["physicalLocation"]
    assert loc["region"]["startLine"] == 16 and loc["artifactLocation"]["uri"].endswith("tgl201_validate.py")
    assert "epoch 2: accuracy" in proc.stdout  # the script's own output is untouched


@pytest.mark.slow
def test_run_module_and_script_arguments(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text((SCRIPTS / "tgl101_running_total.py").read_text().replace(
        'print("mean loss", float(train_epoch(40)))',
        'import sys\nprint("args", sys.argv[1:])\nprint("mean loss", float(train_epoch(int(sys.argv[1]))))'))
    proc = cli("--probes", "retained-graph", "-m", "mypkg.train", "40", "--flag", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "args ['40', '--flag']" in proc.stdout
    assert re.search(r"mypkg/train\.py:17:\d+: TGL101", proc.stdout), proc.stdout


@pytest.mark.slow
def test_run_never_changes_results(tmp_path):
    """Outputs, gradients and parameters are bitwise identical with and without ``run`` (all probes)."""
    plain, probed = tmp_path / "plain.pt", tmp_path / "probed.pt"
    script = str(SCRIPTS / "seeded_training.py")
    subprocess.run([sys.executable, script, str(plain)], check=True, timeout=180, capture_output=True)
    proc = cli(script, str(probed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a, b = torch.load(plain), torch.load(probed)

    def flat(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            for k in sorted(obj):
                yield from flat(obj[k])
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from flat(v)

    ta, tb = list(flat(a)), list(flat(b))
    assert len(ta) == len(tb) > 50
    for x, y in zip(ta, tb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))


def test_watch_context_manager_and_decorator():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stream = io.StringIO()
    with watch(["TGL001"], stream=stream) as w:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    (d,) = w.diagnostics
    assert d.code == "TGL001" and d.path.endswith("test_run.py") and "stale-gradient steps 2/3" in d.message
    assert "TGL001" in stream.getvalue()

    @watch(["module-mode"], report=False)
    def evaluate():
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
        with torch.no_grad():
            net(torch.randn(2, 4))

    evaluate()  # runs, reports nothing (report=False), and each call gets a fresh session
    evaluate()


def test_import_torchgradlint_does_not_import_torch():
    code = "import sys, torchgradlint; assert callable(torchgradlint.watch); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_argument_splitting_and_errors(capsys):
    assert split_argv(["--probes", "TGL001", "train.py", "--lr", "1"]) == (["--probes", "TGL001"], "train.py", None,
                                                                          ["--lr", "1"])
    assert split_argv(["-m", "pkg.mod", "-x"]) == ([], None, "pkg.mod", ["-x"])
    assert resolve_probes(["TGL101", "TGL102", "module-mode"]) == ["retained-graph", "module-mode"]
    with pytest.raises(ValueError):
        resolve_probes(["TGL999"])
    assert run_main([]) == 2
    assert run_main(["missing_script.py"]) == 2
    assert run_main(["--probes", "nope", str(SCRIPTS / "healthy.py")]) == 2
    err = capsys.readouterr().err
    assert "name a script" in err and "no such file" in err and "unknown probe" in err


def test_checkpoint_reads_cuda_memory_after_synchronize_when_the_program_uses_the_gpu(monkeypatch):
    """The CUDA branch on a machine without a GPU: torch.cuda's functions replaced by recorders."""
    from torchgradlint.harness.run import Session

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: calls.append("allocated") or 123)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: calls.append("max") or 456)
    session = Session(["retained-graph"])
    session.checkpoint([])
    assert calls == ["synchronize", "allocated", "max"]
    assert session.samples[0]["cuda_allocated"] == 123 and session.samples[0]["cuda_max_allocated"] == 456


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the program may have initialised CUDA")
def test_checkpoint_without_gpu_reads_no_cuda_memory():
    from torchgradlint.harness.run import Session

    session = Session(["retained-graph"])
    session.checkpoint([])
    assert "cuda_allocated" not in session.samples[0]


def test_a_program_without_backward_is_sampled_at_its_top_level_forwards(tmp_path):
    """An evaluation that keeps every output's graph (no backward at all) is measured per model call."""
    session, _ = session_on(tmp_path, "import torch\n\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 8), "
                            "torch.nn.ReLU())\noutputs = []\nfor _ in range(8):\n"
                            "    outputs.append(model(torch.randn(4, 8)))\n", ["retained-graph"])
    assert session.backward_calls == 0 and sorted(session.forward_samples) == [2, 4, 8]
    (m,) = session.measurements()
    assert m.defect and [(f["code"], f["stack"][0][1]) for f in m.findings] == [("TGL101", 6)]


def test_a_relative_code_file_name_resolves_in_the_current_folder(tmp_path, monkeypatch):
    """Two runs in one process of scripts of one name from two folders (the fixtures of TGL103 and
    TGL201 share names): each resolves to its own folder, absolute names are cached."""
    from torchgradlint.harness import instrument

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        assert instrument._abspath("train.py") == str(tmp_path / folder / "train.py")
    absolute = str(tmp_path / "a" / "train.py")
    assert instrument._abspath(absolute) == absolute and absolute in instrument._abs_cache
