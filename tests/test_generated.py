"""Everything derived from the rule classes is current, and a new rule module needs no edit elsewhere.

The generator is ``scripts/gen_docs.py``; these tests regenerate in memory and compare with the files.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchgradlint import registry
from torchgradlint.cli import main as tgl_main

ROOT = Path(__file__).resolve().parent.parent


def _load_gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_gen_docs()


def test_generated_files_are_current():
    stale = gen_docs.out_of_date(ROOT)
    assert not stale, (f"out of date with the rule classes: {', '.join(stale)}; "
                       f"regenerate with `{registry.REGENERATE}` and commit the result")


def test_rule_index_lists_every_discovered_rule():
    assert registry.index_entries(registry.all_rules()) == tuple(registry.rule_index())


def test_a_stale_rule_index_is_an_error_naming_the_command(monkeypatch):
    monkeypatch.setattr(registry, "_RULES", None)
    monkeypatch.setattr(registry, "rule_index", lambda: ())
    with pytest.raises(RuntimeError, match="scripts/gen_docs.py"):
        registry.all_rules()


def test_rule_all_lists_every_rule_from_its_class(capsys):
    assert tgl_main(["rule", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == [r.code for r in registry.all_rules()]
    for line, rule in zip(lines, registry.all_rules()):
        assert line.split()[1] == rule.name and rule.summary in line
        assert ("off by default" in line) == (not rule.default_enabled)
        assert ("autofix" in line) == (rule.fix_availability != "none")


def test_rule_explains_one_rule_by_code_or_name(capsys):
    rule = registry.all_rules()[0]
    assert tgl_main(["rule", rule.name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {rule.name} ({rule.code})") and rule.docs.strip() in out


def test_a_missing_marker_is_a_clear_error(tmp_path):
    (tmp_path / "README.md").write_text("# no table markers here\n")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "README.md: missing the marker lines" in proc.stderr
    assert "Traceback" not in proc.stderr


NEW_RULE = '''
from torchgradlint.registry import Finding, Rule


class FakeAdvice(Rule):
    """Test rule. Rests on: nothing."""

    code = "TGL999"
    name = "fake-advice"
    summary = "a rule added as one module"
    default_enabled = False
    docs = "## What it does\\nNothing.\\n"

    def check(self, model):
        return iter(())
'''

ADD_RULE_AND_GENERATE = """
import importlib.util, sys
from pathlib import Path
import torchgradlint.rules as pkg
from torchgradlint import registry
rules_dir, root, gen = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
pkg.__path__.append(rules_dir)  # a new module in the rules package, and no edit anywhere else
try:
    registry.all_rules()
except RuntimeError as exc:
    print("STALE:", exc)
spec = importlib.util.spec_from_file_location("gen_docs", gen)
gen_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_docs)
print("CHECK-BEFORE:", gen_docs.main(["--root", str(root), "--check"]))
print("GENERATE:", gen_docs.main(["--root", str(root)]))
print("CHECK-AFTER:", gen_docs.main(["--root", str(root), "--check"]))
index = {}
exec((root / "src" / "torchgradlint" / "rule_index.py").read_text(), index)
import torchgradlint.rule_index
torchgradlint.rule_index.RULES = index["RULES"]  # as if the regenerated module were installed
print("RULES:", [r.code for r in registry.all_rules()])
print("DEFAULT:", registry.resolve_codes([]))
print("SELECTED:", registry.resolve_codes([registry.RuleLayer(select=("fake-advice",))]))
"""


def test_a_new_rule_module_is_picked_up_everywhere_by_the_one_command(tmp_path):
    rules_dir = tmp_path / "extra_rules"
    rules_dir.mkdir()
    (rules_dir / "fake_advice.py").write_text(NEW_RULE)
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    shutil.copytree(ROOT / "docs" / "rules", root / "docs" / "rules")
    for name in ("README.md", "mkdocs.yml"):
        shutil.copy(ROOT / name, root / name)
    proc = subprocess.run([sys.executable, "-c", ADD_RULE_AND_GENERATE, str(rules_dir), str(root),
                           str(ROOT / "scripts" / "gen_docs.py")], capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "STALE: torchgradlint.rule_index is out of date" in out and "python scripts/gen_docs.py" in out
    assert "CHECK-BEFORE: 1" in out and "GENERATE: 0" in out and "CHECK-AFTER: 0" in out
    assert "out of date: docs/rules/TGL999.md" in proc.stderr
    assert "'TGL999'" in out.split("RULES:")[1].splitlines()[0]
    assert "TGL999" not in out.split("DEFAULT:")[1].splitlines()[0]  # off by default
    assert "SELECTED: ('TGL999',)" in out
    page = (root / "docs" / "rules" / "TGL999.md").read_text()
    assert page.startswith("# TGL999: fake-advice\n\na rule added as one module\n")
    assert "Off by default" in page and "No harness evidence recorded for this rule." in page
    assert "| [TGL999](TGL999.md) | fake-advice | a rule added as one module | off | no |" in \
        (root / "docs" / "rules" / "index.md").read_text()
    assert "| [TGL999](docs/rules/TGL999.md) | fake-advice |" in (root / "README.md").read_text()
    assert "      - TGL999 fake-advice: rules/TGL999.md\n      # END rule pages" in (root / "mkdocs.yml").read_text()
    assert "('TGL999', 'fake-advice', False, (), False, False, '')," in \
        (root / "src" / "torchgradlint" / "rule_index.py").read_text()
    for code in ("TGL001", "TGL101"):  # existing pages keep their measured evidence
        assert (root / "docs" / "rules" / f"{code}.md").read_text() == (ROOT / "docs" / "rules" / f"{code}.md").read_text()


def test_a_page_of_a_removed_rule_is_stale(tmp_path):
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", root / "docs")
    (root / "src" / "torchgradlint").mkdir(parents=True)
    shutil.copy(ROOT / "src" / "torchgradlint" / "rule_index.py", root / "src" / "torchgradlint" / "rule_index.py")
    for name in ("README.md", "mkdocs.yml"):
        shutil.copy(ROOT / name, root / name)
    assert gen_docs.out_of_date(root) == []
    (root / "docs" / "rules" / "TGL998.md").write_text("# TGL998: gone\n")
    assert gen_docs.out_of_date(root) == ["docs/rules/TGL998.md"]
    assert gen_docs.main(["--root", str(root)]) == 0
    assert not (root / "docs" / "rules" / "TGL998.md").exists() and gen_docs.out_of_date(root) == []
