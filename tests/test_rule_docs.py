"""Generated per rule (parametrised over every discovered rule, so a new rule module gets these tests
with no edit here): its declaration is complete, its docs carry ruff's headings in order, its "Example"
fires and its "Use instead" is silent."""

import re
from pathlib import Path

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.registry import DOC_HEADINGS, FIX_AVAILABILITY, Rule, all_rules

RULES = all_rules()
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
_CODE_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def code_blocks(rule: type[Rule], heading: str) -> list[str]:
    """The ```python blocks under ``## heading`` of the rule's docs."""
    return _CODE_BLOCK.findall(rule.section(heading))


def test_every_rule_module_is_discovered():
    assert RULES and all(issubclass(r, Rule) for r in RULES)
    assert [r.code for r in RULES] == sorted({r.code for r in RULES})


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_declares_itself(rule):
    assert _KEBAB.match(rule.name), rule.name
    assert rule.__module__ == f"torchgradlint.rules.{rule.name.replace('-', '_')}"  # one module, named after it
    assert rule.summary.strip() and "\n" not in rule.summary.strip()
    assert rule.fix_availability in FIX_AVAILABILITY
    assert isinstance(rule.default_enabled, bool)
    assert rule.default_enabled == (not rule.code.startswith("TGL9")), "TGL9xx advice is off by default, the rest on"
    assert rule.__doc__ and "Rests on" in rule.__doc__  # the PyTorch documentation the rule rests on


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_docs_have_ruffs_headings_in_order(rule):
    headings = re.findall(r"^## (.+?)\s*$", rule.docs, re.M)
    expected = [h for h in DOC_HEADINGS if h != "Fix safety" or rule.fix_availability != "none"]
    assert headings == expected, f"{rule.code}: headings {headings}, expected {expected}"
    assert len(code_blocks(rule, "Example")) == 1 and len(code_blocks(rule, "Use instead")) == 1
    assert re.search(r"\]\(https?://", rule.section("References")), "References link the documentation"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_docs_example_fires(rule):
    """Exactly one finding, of the rule's own code (no TGL000: the example parses)."""
    example, = code_blocks(rule, "Example")
    diagnostics = lint_source(example, "example.py", [rule]).diagnostics
    assert [d.code for d in diagnostics] == [rule.code], \
        f"{rule.code}: the docs' Example raises {[(d.code, d.line, d.message) for d in diagnostics]}, expected one {rule.code}"
    found = diagnostics
    if rule.fix_availability == "none":
        assert all(d.fix is None for d in found), f"{rule.code} attaches a fix but declares fix_availability 'none'"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_docs_use_instead_is_silent(rule):
    """No diagnostic at all (no TGL000 either: the block parses)."""
    use_instead, = code_blocks(rule, "Use instead")
    found = lint_source(use_instead, "example.py", [rule]).diagnostics
    assert not found, f"{rule.code}: the docs' 'Use instead' raises {[(d.code, d.line, d.message) for d in found]}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_with_fixtures_declares_a_harness_probe(rule):
    from torchgradlint.harness.probe_registry import all_probes  # imports torch, a test dependency

    PROBES = all_probes()

    assert not rule.probe or rule.probe in PROBES, f"{rule.code}: probe {rule.probe!r} not in {sorted(PROBES)}"
    if (FIXTURES / rule.code).is_dir():
        assert rule.probe, f"{rule.code} has fixtures but declares no probe to measure them"
