"""Generated from fixtures/: each file's findings are exactly its ``# expect:`` lines."""

from pathlib import Path

import pytest

from torchgradlint.engine import lint_file
from torchgradlint.fixture_spec import load_fixtures
from torchgradlint.registry import all_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ALL = load_fixtures(FIXTURES)


@pytest.mark.parametrize("fixture", ALL, ids=[f.name for f in ALL])
def test_findings_match_expectations(fixture):
    result = lint_file(str(fixture.path), all_rules())
    found = {(d.code, d.line) for d in result.diagnostics}
    assert found == set(fixture.expected)


@pytest.mark.parametrize("fixture", ALL, ids=[f.name for f in ALL])
def test_fixture_kind_matches_expectations(fixture):
    own = {c for c, _ in fixture.expected if c == fixture.code}
    if fixture.kind == "bad":
        assert own, f"{fixture.name} is a bad fixture but promises no {fixture.code} finding"
    else:
        assert not fixture.expected, f"{fixture.name} is an ok fixture but promises findings"


@pytest.mark.parametrize("fixture", ALL, ids=[f.name for f in ALL])
def test_fixture_defines_entry_point(fixture):
    text = fixture.path.read_text(encoding="utf-8")
    assert "def main(device" in text, "fixtures define main(device, steps) for the harness"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_every_rule_has_enough_fixtures(rule):
    mine = [f for f in ALL if f.code == rule.code]
    assert sum(f.kind == "bad" for f in mine) >= 3, f"{rule.code} needs at least 3 bad fixtures"
    assert sum(f.kind == "ok" for f in mine) >= 4, f"{rule.code} needs at least 4 ok fixtures"
