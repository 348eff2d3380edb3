"""flake8 plugin: same findings as the CLI, noqa by flake8, no work when TGL is not selected."""

import json
import subprocess
import sys
from pathlib import Path


from torchgradlint.flake8_plugin import Plugin
from torchgradlint.registry import all_rules

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def _cli_findings(path):
    out = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "--output-format", "json",
                          "--exit-zero", str(path)], capture_output=True, text=True, check=True)
    return {(Path(d["filename"]).resolve(), d["location"]["row"], d["location"]["column"], d["code"])
            for d in json.loads(out.stdout)}


def _flake8_findings(path, select="TGL"):
    out = subprocess.run([sys.executable, "-m", "flake8", "--isolated", f"--select={select}",
                          "--format=%(path)s\t%(row)d\t%(col)d\t%(code)s", str(path)],
                         capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    found = set()
    for line in out.stdout.splitlines():
        p, row, col, code = line.split("\t")
        found.add((Path(p).resolve(), int(row), int(col), code))
    return found


def test_flake8_reports_exactly_the_cli_findings_on_fixtures():
    cli = _cli_findings(FIXTURES)
    assert cli, "the fixtures must produce findings"
    assert _flake8_findings(FIXTURES) == cli


def test_flake8_honours_noqa(tmp_path):
    src = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()
    target = tmp_path / "train.py"
    target.write_text(src.replace("# expect: TGL001", "# noqa: TGL001"))
    assert _flake8_findings(target) == set()
    assert _cli_findings(target) == set()
    target.write_text(src.replace("# expect: TGL001", "# noqa: E501"))
    assert {c for *_, c in _flake8_findings(target)} == {"TGL001"}
    assert {c for *_, c in _cli_findings(target)} == {"TGL001"}


_RUN_FLAKE8_WITH_TRAPPED_ENGINE = """
import sys
import torchgradlint.engine as engine

def trapped(*args, **kwargs):
    raise SystemExit("ENGINE-RAN")

engine.lint_source = trapped
from flake8.main.cli import main
main(sys.argv[1:])
"""


def _flake8_engine_runs(select, target):
    out = subprocess.run([sys.executable, "-c", _RUN_FLAKE8_WITH_TRAPPED_ENGINE, "--isolated",
                          f"--select={select}", str(target)], capture_output=True, text=True)
    return "ENGINE-RAN" in out.stdout + out.stderr


def test_plugin_does_no_parsing_when_no_tgl_code_is_selected():
    target = FIXTURES / "TGL001" / "bad_basic_loop.py"
    assert not _flake8_engine_runs("F", target)
    assert _flake8_engine_runs("F,TGL", target)  # the trap does fire when TGL is selected


_RUN_FLAKE8_REPORT_IMPORTS = """
import sys
from flake8.main.application import Application
app = Application()
app.run(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m == "libcst" or m.startswith("torchgradlint.rules."))
print("IMPORTED:" + ",".join(heavy))
"""


def _flake8_heavy_imports(select, *targets):
    out = subprocess.run([sys.executable, "-c", _RUN_FLAKE8_REPORT_IMPORTS, "--isolated", f"--select={select}",
                          *map(str, targets)], capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("IMPORTED:")]
    assert line, out.stdout + out.stderr
    return line[0].removeprefix("IMPORTED:")


def test_plugin_imports_neither_rules_nor_libcst_when_no_tgl_code_is_selected():
    target = FIXTURES / "TGL001" / "bad_basic_loop.py"
    assert _flake8_heavy_imports("F", target) == ""
    assert "libcst" in _flake8_heavy_imports("F,TGL", target).split(",")  # the probe does see imports


def test_plugin_selects_by_flake8_decision():
    from flake8.style_guide import DecisionEngine

    options = type("Options", (), dict(select=["TGL0"], ignore=["TGL002"], extend_select=None,
                                       extended_default_select=["TGL", "F"], extend_ignore=None,
                                       extended_default_ignore=[]))()
    engine = DecisionEngine(options)
    Plugin.parse_options(options)
    codes = set(Plugin(None, [], "-").selected_codes())
    assert codes == {r.code for r in all_rules() if engine.decision_for(r.code).name == "Selected"}
    assert "TGL001" in codes and "TGL002" not in codes
    assert not any(c.startswith("TGL1") for c in codes)


def test_plugin_columns_are_zero_based():
    Plugin.parse_options(type("O", (), {})())  # unusual options object: falls back to defaults
    lines = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text().splitlines(keepends=True)
    (row, col, msg, _), = [r for r in Plugin(None, lines, "x.py").run() if r[2].startswith("TGL001")]
    assert (row, col) == (16, 8)
    assert msg.startswith("TGL001 ")


def test_plugin_imports_neither_rules_nor_libcst_for_a_file_the_prefilter_rules_out(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import os\n\nprint(os.getcwd())\n")
    library = tmp_path / "layers.py"  # torch, but methods only and no backward: stage 2 rules it out
    library.write_text("import torch\n\n\nclass Block(torch.nn.Module):\n    def forward(self, x):\n"
                       "        return [x] + [x]\n")
    assert _flake8_heavy_imports("F,TGL", plain) == ""
    assert _flake8_heavy_imports("F,TGL", library) == ""


def test_rule_prefilter_table_matches_the_rule_classes():
    from torchgradlint.registry import rule_index

    expected = {r.code: (r.prefilter, r.needs_backward, r.needs_grad_evidence) for r in all_rules()}
    got = {r.code: (r.prefilter, r.needs_backward, r.needs_grad_evidence) for r in rule_index()}
    assert got == expected, "torchgradlint.rule_index is stale: run python scripts/gen_docs.py"
LOSSES = (FIXTURES / "TGL101" / "bad_losses_append.py").read_text()


def _flake8_stdin(cwd, *args):
    return subprocess.run([sys.executable, "-m", "flake8", "--select=TGL", *args, "-"], input=LOSSES,
                          capture_output=True, text=True, cwd=cwd)


def test_flake8_stdin_honours_the_pyproject_table_like_check(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.torchgradlint]\nignore = ["TGL101"]\n')
    for args in ((), ("--stdin-display-name", "src/train.py")):
        out = _flake8_stdin(tmp_path, *args)
        assert out.returncode == 0 and out.stdout == "", (args, out.stdout, out.stderr)
        check = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "-"], input=LOSSES,
                               capture_output=True, text=True, cwd=tmp_path)
        assert check.returncode == 0, check.stdout
    (tmp_path / "pyproject.toml").write_text('[tool.torchgradlint]\nignore = ["TGL001"]\n')
    out = _flake8_stdin(tmp_path)
    assert out.returncode == 1 and ":19:9: TGL101 " in out.stdout


def test_flake8_rejects_an_unknown_tgl_selector_like_check(tmp_path):
    target = tmp_path / "train.py"
    target.write_text(LOSSES)
    for option in ("--select=TGL999", "--extend-select=TGL9", "--ignore=E501,TGL7"):
        out = subprocess.run([sys.executable, "-m", "flake8", "--isolated", option, str(target)],
                             capture_output=True, text=True)
        assert out.returncode == 2, (option, out.stdout, out.stderr)
        assert "unknown rule selector" in out.stderr and "Traceback" not in out.stderr and out.stdout == ""
    check = subprocess.run([sys.executable, "-m", "torchgradlint", "check", "--select", "TGL999", str(target)],
                           capture_output=True, text=True)
    assert check.returncode == 2 and "unknown rule selector 'TGL999'" in check.stderr
    ok = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=TGL1,TGL000", str(target)],
                        capture_output=True, text=True)
    assert ok.returncode == 1 and "TGL101" in ok.stdout


def test_parallel_flake8_imports_the_engine_once_before_forking_its_workers(tmp_path):
    """With TGL selected and several files, flake8's main process imports the
    engine just before it forks its pool (the workers inherit it); with only
    F selected it never does, and a fork that is not flake8's pool is left
    alone. Findings are those of a serial run."""
    files = [str(FIXTURES / "TGL001" / "bad_basic_loop.py"), str(FIXTURES / "TGL101" / "bad_losses_append.py")]
    assert "libcst" in _flake8_heavy_imports("F,TGL", "--jobs=2", *files).split(",")
    assert _flake8_heavy_imports("F", "--jobs=2", *files) == ""
    probe = ("import os, sys\nfrom torchgradlint import flake8_plugin\n"
             "flake8_plugin._preload_before_pool_fork()\nprint('libcst' in sys.modules)\n")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"
    serial = set()
    for f in files:
        serial |= _flake8_findings(f)
    both = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=TGL", "--jobs=2",
                           "--format=%(path)s\t%(row)d\t%(col)d\t%(code)s", *files], capture_output=True, text=True)
    assert {(Path(p).resolve(), int(r), int(c), code)
            for p, r, c, code in (ln.split("\t") for ln in both.stdout.splitlines())} == serial != set()
